package jcs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/jcs"
)

func TestCheckIJSON(t *testing.T) {
	for _, ok := range []string{
		`{}`, `{"n":9007199254740991}`, `{"n":-9007199254740991}`, `{"f":1.5e300}`, `{"a":[1,{"b":2}],"b":{"a":1}}`,
		`{"n":9007199254740993.0}`, `not json`, `{"a":`,
	} {
		require.NoError(t, jcs.CheckIJSON([]byte(ok)), ok)
	}
	for in, where := range map[string]string{
		`{"n":9007199254740993}`:          "params.n",
		`{"n":9007199254740992}`:          "params.n",
		`{"n":-9007199254740993}`:         "params.n",
		`{"a":[1,{"n":1` + zeros + `}]}`:  "params.a[1].n",
		`{"f":1e400}`:                     "params.f",
		`{"a":1,"a":2}`:                   "params.a appears twice",
		`{"x":{"a":1,"b":{"c":1,"c":2}}}`: "params.x.b.c appears twice",
	} {
		err := jcs.CheckIJSON([]byte(`{"params":` + in + `}`))
		require.ErrorIs(t, err, jcs.ErrIJSON, in)
		require.Contains(t, err.Error(), where, in)
	}
	require.ErrorContains(t, jcs.CheckIJSON([]byte(`{"target":"a","target":"b"}`)), "target appears twice")
}

const zeros = "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
