package jcs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrIJSON: the text is JSON but not I-JSON (RFC 7493): an object with two
// members of one name, an integer beyond ±(2^53-1), or a number no double holds.
var ErrIJSON = errors.New("not I-JSON")

// maxSafeInteger is 2^53: from it on, two integers may share one double, so
// an integer written without fraction or exponent would silently change.
const maxSafeInteger = 1 << 53

// CheckIJSON reports the first reason data is not I-JSON, naming where
// ("params.n", "steps[0].step"), or nil. Canonicalize accepts any JSON whose
// numbers are finite doubles; callers that must keep every value exactly as
// sent check this first. Syntax errors are left to the decoder.
func CheckIJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	w := &ijsonWalker{dec: dec}
	tok, err := dec.Token()
	if err != nil {
		return nil // not JSON at all: the caller's decoder says why
	}
	return w.value(tok, "")
}

type ijsonWalker struct{ dec *json.Decoder }

func (w *ijsonWalker) value(tok json.Token, path string) error {
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return w.object(path)
		case '[':
			return w.array(path)
		}
	case json.Number:
		return number(t.String(), path)
	}
	return nil
}

func (w *ijsonWalker) object(path string) error {
	seen := map[string]bool{}
	for {
		tok, err := w.dec.Token()
		if err != nil {
			return nil // a syntax error: the caller's decoder says why
		}
		if d, ok := tok.(json.Delim); ok && d == '}' {
			return nil
		}
		name, _ := tok.(string)
		at := name
		if path != "" {
			at = path + "." + name
		}
		if seen[name] {
			return fmt.Errorf("%w: %s appears twice", ErrIJSON, at)
		}
		seen[name] = true
		tok, err = w.dec.Token()
		if err != nil {
			return nil // a syntax error: the caller's decoder says why
		}
		if err := w.value(tok, at); err != nil {
			return err
		}
	}
}

func (w *ijsonWalker) array(path string) error {
	for i := 0; ; i++ {
		tok, err := w.dec.Token()
		if err != nil {
			return nil // a syntax error: the caller's decoder says why
		}
		if d, ok := tok.(json.Delim); ok && d == ']' {
			return nil
		}
		if err := w.value(tok, fmt.Sprintf("%s[%d]", path, i)); err != nil {
			return err
		}
	}
}

func number(lit, path string) error {
	if path == "" {
		path = "the value"
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return fmt.Errorf("%w: %s: the number %s does not fit in a double; send it as a string", ErrIJSON, path, lit)
	}
	if !strings.ContainsAny(lit, ".eE") && math.Abs(f) >= maxSafeInteger {
		return fmt.Errorf("%w: %s: the integer %s is beyond ±(2^53-1); send it as a string", ErrIJSON, path, lit)
	}
	return nil
}
