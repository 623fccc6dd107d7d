package apiwire

import (
	"encoding/json"
	"strconv"
	"time"
)

// AppendJSON appends the operation as json.Marshal writes it, byte for
// byte, and returns json.Marshal's error where it has one.
//
// An operation is the answer to every submit and every ?wait=, so it is
// written by hand: encoding/json reaches each field by reflection and
// scans both raw members (params, result) again to compact them. This
// writes a record whose strings need no escaping, whose times fall in
// json.Marshal's years and whose raw members are valid and already
// compact; any other goes to json.Marshal itself. TestAppendJSONIsMarshal
// and FuzzAppendJSONIsMarshal hold the two equal.
func (o Operation) AppendJSON(b []byte) ([]byte, error) {
	if !o.plain() {
		m, err := json.Marshal(o)
		if err != nil {
			return b, err
		}
		return append(b, m...), nil
	}
	b = appendMember(b, '{', "operation_id", o.OperationID)
	b = appendMember(b, ',', "status", o.Status)
	b = appendMember(b, ',', "request_hash", o.RequestHash)
	b = appendMember(b, ',', "action", o.Action)
	b = appendMember(b, ',', "target", o.Target)
	b = appendRaw(append(b, `,"params":`...), o.Params)
	b = appendRaw(append(b, `,"result":`...), o.Result)
	if o.Reason != "" {
		b = appendMember(b, ',', "reason", o.Reason)
	}
	b = appendMember(b, ',', "command_id", o.CommandID)
	b = appendStrings(append(b, `,"command_ids":`...), o.CommandIDs)
	b = strconv.AppendInt(append(b, `,"attempt":`...), int64(o.Attempt), 10)
	for _, m := range [...]struct{ name, v string }{
		{"task_id", o.TaskID}, {"step", o.Step}, {"business_version", o.BusinessVersion}, {"compensates", o.Compensates},
	} {
		if m.v != "" {
			b = appendMember(b, ',', m.name, m.v)
		}
	}
	b = appendStrings(append(b, `,"compensations":`...), o.Compensations)
	b = appendMember(b, ',', "owner", o.Owner)
	b = strconv.AppendInt(append(b, `,"fencing_token":`...), o.FencingToken, 10)
	b = appendTime(append(b, `,"lease_expires_at":`...), o.LeaseExpiresAt)
	b = strconv.AppendInt(append(b, `,"version":`...), o.Version, 10)
	b = appendTime(append(b, `,"started_at":`...), o.StartedAt)
	b = appendTime(append(b, `,"updated_at":`...), o.UpdatedAt)
	b = appendMember(b, ',', "submitted_by", o.SubmittedBy)
	b = appendMember(b, ',', "via", o.Via)
	if o.ApprovedBy != "" {
		b = appendMember(b, ',', "approved_by", o.ApprovedBy)
	}
	if o.ApprovedVersion != 0 {
		b = strconv.AppendInt(append(b, `,"approved_version":`...), int64(o.ApprovedVersion), 10)
	}
	return append(b, '}'), nil
}

// Operations is a page of operations (GET /v1/operations).
type Operations []Operation

// AppendJSON appends the page as json.Marshal writes it (Operation.AppendJSON).
func (l Operations) AppendJSON(b []byte) ([]byte, error) {
	if l == nil {
		return append(b, "null"...), nil
	}
	b = append(b, '[')
	for i := range l {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = l[i].AppendJSON(b); err != nil {
			return b, err
		}
	}
	return append(b, ']'), nil
}

// plain says AppendJSON may write o itself.
func (o *Operation) plain() bool {
	for _, s := range [...]string{o.OperationID, o.Status, o.RequestHash, o.Action, o.Target, o.Reason, o.CommandID,
		o.TaskID, o.Step, o.BusinessVersion, o.Compensates, o.Owner, o.SubmittedBy, o.Via, o.ApprovedBy} {
		if !PlainString(s) {
			return false
		}
	}
	for _, l := range [...][]string{o.CommandIDs, o.Compensations} {
		for _, s := range l {
			if !PlainString(s) {
				return false
			}
		}
	}
	for _, t := range [...]time.Time{o.LeaseExpiresAt, o.StartedAt, o.UpdatedAt} {
		if !PlainTime(t) {
			return false
		}
	}
	return plainRaw(o.Params) && plainRaw(o.Result)
}

// PlainString says encoding/json writes s as it is, between quotes:
// printable ASCII without the quote, the backslash and the characters it
// escapes for HTML (<, >, &). The API's hand-written encoders (here, and
// the event stream's) write such strings themselves.
func PlainString(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// plainRaw says encoding/json writes a raw member as it is: nil (null), or
// valid JSON that compacting and its HTML escapes leave alone (no
// whitespace, no <, > or &, and no byte 0xE2, which begins U+2028 and
// U+2029, the two characters it escapes in strings as well).
func plainRaw(m json.RawMessage) bool {
	if m == nil {
		return true
	}
	for _, c := range m {
		switch c {
		case ' ', '\t', '\r', '\n', '<', '>', '&', 0xe2:
			return false
		}
	}
	return json.Valid(m)
}

// PlainTime says json.Marshal writes t without an error: a year of four
// digits and a zone less than 24 hours from UTC.
func PlainTime(t time.Time) bool {
	_, off := t.Zone()
	y := t.Year()
	return y >= 0 && y <= 9999 && off > -24*3600 && off < 24*3600
}

func appendMember(b []byte, sep byte, name, v string) []byte {
	b = append(b, sep, '"')
	b = append(b, name...)
	b = append(b, `":"`...)
	b = append(b, v...)
	return append(b, '"')
}

func appendRaw(b []byte, m json.RawMessage) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	return append(b, m...)
}

func appendStrings(b []byte, l []string) []byte {
	if l == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(append(append(b, '"'), s...), '"')
	}
	return append(b, ']')
}

func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}
