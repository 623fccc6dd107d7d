package api

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
)

// mayHoldInexactName answers false only when the walk could find nothing:
// it is true for a name in another case anywhere (a value too: the walk
// decides), and for any escape or byte beyond ASCII.
func TestMayHoldInexactName(t *testing.T) {
	names := foldedNames(reflect.TypeFor[apiwire.SubmitRequest]())
	for body, want := range map[string]bool{
		`{"operation_id":"op-1","target":"device-1","action":"restart","params":{}}`: false,
		`{"target":"x","params":{"mode":"fast","n":[1,"a"]}}`:                        false,
		`{"Target":"device-1"}`:                         true,
		`{"target":"device-1","params":{"ACTION":1}}`:   true,
		`{"target":"OPERATION_ID"}`:                     true,
		`{"target":"a\"b"}`:                             true,
		`{"target":"é"}`:                                true,
		`{"target":"` + strings.Repeat("a", 100) + `"}`: false,
	} {
		require.Equal(t, want, mayHoldInexactName([]byte(body), names), body)
		if !want {
			bad, ok := inexactName(json.NewDecoder(strings.NewReader(body)), reflect.TypeFor[apiwire.SubmitRequest]())
			require.True(t, ok, body)
			require.Empty(t, bad, body)
		}
	}
}
