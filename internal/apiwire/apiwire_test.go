package apiwire

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.txt from the types (a deliberate change of the wire format)")

// TestWireFormatUnchanged encodes every type, zero and with every field
// set, and compares the bytes with testdata/golden.txt. The file was
// written from the types as they were in internal/api, internal/store
// (Step), internal/rollout (the spec) and internal/events (the stream's
// data) before they moved here: the move changed no byte on the wire.
func TestWireFormatUnchanged(t *testing.T) {
	got := goldenOf(map[string]any{
		"SubmitRequest": SubmitRequest{}, "Operation": Operation{}, "Receipt": Receipt{}, "Event": Event{},
		"Command": Command{}, "Device": Device{}, "Caps": Caps{}, "Error": Error{},
		"TaskRequest": TaskRequest{}, "PlanRequest": PlanRequest{}, "ApprovalRequest": ApprovalRequest{},
		"RejectionRequest": RejectionRequest{}, "TaskStep": TaskStep{}, "TaskView": TaskView{},
		"ApprovalV": ApprovalV{}, "HistoryEv": HistoryEv{}, "GrantRequest": GrantRequest{},
		"GrantView": GrantView{}, "CompensationRequest": CompensationRequest{}, "Who": Who{},
		"TaskListItem": TaskListItem{}, "InstanceView": InstanceView{}, "ResolveRequest": ResolveRequest{},
		"RolloutRequest": RolloutRequest{}, "RolloutApprovalRequest": RolloutApprovalRequest{},
		"RolloutView": RolloutView{}, "RolloutApprV": RolloutApprV{}, "RolloutRate": RolloutRate{},
		"RolloutAbort": RolloutAbort{}, "RolloutWindow": RolloutWindow{}, "RolloutLeaseV": RolloutLeaseV{},
		"RolloutDeviceView": RolloutDeviceView{}, "Step": Step{}, "RolloutSpec": RolloutSpec{}, "Ramp": Ramp{},
		"AbortRule": AbortRule{}, "MaintenanceWindow": MaintenanceWindow{}, "EventData": EventData{},
		"AuditEntry": AuditEntry{},
	})
	path := filepath.Join("testdata", "golden.txt")
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "the JSON of an API type changed; if on purpose, run with -update and say so in docs/api.md")
}

// fill sets every field of v, recursively, to a value derived from its
// name: a string is its name, a number its name's length, a bool true, a
// time a fixed instant plus that many seconds, a pointer or a slice one
// filled element, a map one entry, raw JSON an object naming the field.
func fill(v reflect.Value, name string) {
	switch {
	case v.Type() == reflect.TypeFor[json.RawMessage]():
		v.SetBytes([]byte(`{"f":"` + name + `"}`))
		return
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2026, 3, 1, 2, 3, 4, 5000, time.UTC).Add(time.Duration(len(name)) * time.Second)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(name)
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(len(name)))
	case reflect.Float64:
		v.SetFloat(float64(len(name)) + 0.5)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), name)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), name)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		e := reflect.New(v.Type().Elem()).Elem()
		fill(e, name)
		v.SetMapIndex(reflect.ValueOf("k-"+name), e)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), v.Type().Field(i).Name)
			}
		}
	default:
		panic("fill: no rule for " + v.Type().String())
	}
}

// goldenOf encodes each value twice, zero and filled, one line each, by name.
func goldenOf(values map[string]any) []byte {
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	sort.Strings(names)
	var out bytes.Buffer
	for _, n := range names {
		t := reflect.TypeOf(values[n])
		zero, err := json.Marshal(reflect.New(t).Interface())
		if err != nil {
			panic(err)
		}
		full := reflect.New(t)
		fill(full.Elem(), n)
		filled, err := json.Marshal(full.Interface())
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(&out, "%s zero %s\n%s filled %s\n", n, zero, n, filled)
	}
	return out.Bytes()
}

// TestClientsLinkNoDatabase checks that the packages that speak the API
// from outside link no database driver and none of the controller's
// server side: they build on this package alone for the API's bodies.
func TestClientsLinkNoDatabase(t *testing.T) {
	const module = "github.com/fleetctl/fleetctl/"
	clean := []string{module + "internal/apiwire", module + "internal/client", module + "internal/mcpserver"}
	forbidden := []string{"github.com/jackc/pgx", "github.com/mattn/go-sqlite3", "github.com/lib/pq",
		module + "internal/store", module + "internal/api", module + "internal/ops", module + "internal/rollout",
		module + "internal/controller"}
	for _, pkg := range clean {
		deps := testenv.Deps(t, pkg)
		require.Contains(t, deps, pkg, "go list -deps %s listed nothing of it", pkg)
		for _, f := range forbidden {
			if linked := testenv.Linked(deps, f); len(linked) > 0 {
				t.Errorf("%s links %s (%s)", pkg, f, strings.Join(linked, ", "))
			}
		}
	}
}
