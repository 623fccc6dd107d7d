package mcpserver_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/mcpserver"
)

// jsonNames lists the JSON member names of a struct type, those of its
// embedded structs included.
func jsonNames(t reflect.Type) map[string]bool {
	names := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			for n := range jsonNames(f.Type) {
				names[n] = true
			}
		case name == "":
			names[f.Name] = true
		default:
			names[name] = true
		}
	}
	return names
}

// TestToolTypesUseTheAPIsNames: the tools' inputs are sent to the API as
// they came and their outputs are decoded from its answers (see the
// package doc), so every member they name must be one of the API's own
// body (apiwire); the tools' types are views of their own (with the schema
// an agent reads, and fewer fields), not a second definition of the API.
func TestToolTypesUseTheAPIsNames(t *testing.T) {
	for _, c := range []struct {
		tool, api any
		not       []string // members the tool has that the API body has not
	}{
		{mcpserver.SubmitInput{}, apiwire.SubmitRequest{}, nil},
		{mcpserver.StepInput{}, apiwire.Step{}, nil},
		{mcpserver.CreateTaskInput{}, apiwire.TaskRequest{}, nil},
		{mcpserver.UpdatePlanInput{}, apiwire.PlanRequest{}, []string{"task_id"}}, // the path's
		{mcpserver.RampInput{}, apiwire.Ramp{}, nil},
		{mcpserver.AbortInput{}, apiwire.AbortRule{}, nil},
		{mcpserver.WindowInput{}, apiwire.MaintenanceWindow{}, nil},
		{mcpserver.CreateRolloutInput{}, apiwire.RolloutRequest{}, nil},
		{mcpserver.Operation{}, apiwire.Operation{}, nil},
		{mcpserver.Receipt{}, apiwire.Receipt{}, nil},
		{mcpserver.Event{}, apiwire.Event{}, nil},
		{mcpserver.Command{}, apiwire.Command{}, nil},
		{mcpserver.Device{}, apiwire.Device{}, nil},
		{mcpserver.DeviceDetail{}, apiwire.DeviceDetail{}, nil},
		{mcpserver.Device{}.Capabilities, apiwire.Caps{}, nil},
		{mcpserver.TaskStep{}, apiwire.TaskStep{}, nil},
		{mcpserver.Approval{}, apiwire.ApprovalV{}, nil},
		{mcpserver.HistoryEntry{}, apiwire.HistoryEv{}, nil},
		{mcpserver.Task{}, apiwire.TaskView{}, nil},
		{mcpserver.Rollout{}, apiwire.RolloutView{}, []string{"answer"}}, // the API's whole answer
	} {
		tool, api := reflect.TypeOf(c.tool), reflect.TypeOf(c.api)
		apiNames := jsonNames(api)
		for _, n := range c.not {
			apiNames[n] = true
		}
		for n := range jsonNames(tool) {
			if !apiNames[n] {
				t.Errorf("%s has %q, which apiwire.%s has not", tool, n, api.Name())
			}
		}
	}
}
