package ops

// Fuzz targets for what a submit and a task step derive: the operation id of
// a direct submit (operationID: the whole id from the body or the
// Idempotency-Key header, else task_id:step:target:business_version), and
// the params and request_hash of an approved plan's step. `go test` runs the
// seeds under testdata/fuzz; .ci/fuzz explores each for a few seconds in
// `make test`.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetctl/fleetctl/internal/command"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/jcs"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/store/backend"
)

// validPart and validWhole are the contract's rules written out:
// [A-Za-z0-9._-]{1,64} for a part, [A-Za-z0-9._:-]{1,maxLen} for a whole id.
func validPart(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !idByte(s[i]) {
			return false
		}
	}
	return true
}

func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

func validWhole(id string, maxLen int) bool {
	if len(id) < 1 || len(id) > maxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !idByte(id[i]) && id[i] != ':' {
			return false
		}
	}
	return true
}

// FuzzOperationID: a whole id in the body wins and must be valid (up to 200
// characters) and equal to a header sent with it; else valid parts always
// derive task_id:step:target:business_version, which a header must equal;
// else the header alone; anything accepted is a valid id.
func FuzzOperationID(f *testing.F) {
	f.Fuzz(func(t *testing.T, opID, task, step, target, version, key string) {
		in := Intent{OperationID: opID, TaskID: task, Step: step, Target: target, BusinessVersion: version}
		id, err := operationID(in, key)
		if err != nil && !errors.Is(err, domain.ErrInvalid) && code(err) != "idempotency_key_mismatch" {
			t.Fatalf("operationID(%+v, %q) refused without ErrInvalid: %v", in, key, err)
		}
		parts := domain.OperationParts{TaskID: task, Step: step, Target: target, BusinessVersion: version}
		derivedValid := validPart(task) && validPart(step) && validPart(target) && validPart(version)
		derived := task + ":" + step + ":" + target + ":" + version

		switch {
		case opID != "":
			// A whole id in the body wins over the parts.
			switch {
			case key != "" && key != opID:
				if code(err) != "idempotency_key_mismatch" {
					t.Fatalf("body id %q, header %q: want idempotency_key_mismatch, got %q, %v", opID, key, id, err)
				}
			case validWhole(opID, 200):
				if err != nil || id != opID {
					t.Fatalf("body id %q: got %q, %v", opID, id, err)
				}
			default:
				if err == nil {
					t.Fatalf("invalid body id %q accepted as %q", opID, id)
				}
			}
		case task != "" || step != "" || version != "":
			// The parts: valid ones always derive task:step:target:version.
			switch {
			case !derivedValid:
				if err == nil {
					t.Fatalf("invalid parts %+v accepted as %q", parts, id)
				}
			case key != "" && key != derived:
				if code(err) != "idempotency_key_mismatch" {
					t.Fatalf("parts %+v, header %q: want idempotency_key_mismatch, got %q, %v", parts, key, id, err)
				}
			default:
				if err != nil || id != derived {
					t.Fatalf("valid parts %+v (id %d characters): got %q, %v", parts, len(derived), id, err)
				}
			}
		default:
			// Only the header, if any.
			if valid := validWhole(key, 200); (err == nil) != valid || (valid && id != key) {
				t.Fatalf("header %q alone: got %q, %v", key, id, err)
			}
		}
		if err == nil && !validWhole(id, 400) {
			t.Fatalf("accepted operation id %q is outside [A-Za-z0-9._:-]{1,400}", id)
		}
	})
}

// FuzzStepParams: a plan step's params that the API accepts (an I-JSON
// body, params an object) always run once the plan is approved: the step's
// operation is prepared from the stored, canonical plan with the same
// request_hash as a direct submit of the same params.
func FuzzStepParams(f *testing.F) {
	st, err := backend.Open(context.Background(), store.Config{Path: filepath.Join(f.TempDir(), "c.db"), Instance: "i1"})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	svc := New(Config{Store: st, Instance: "i1", LeaseTTL: 10 * time.Second,
		Policy: func(string) command.Policy { return command.Policy{TTL: time.Minute, MaxAttempts: 3} }})
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, value []byte) {
		// What the API hands over: the body is I-JSON (decodeBody checks
		// it first) and params is one JSON value.
		body := append(append([]byte(`{"params":`), value...), '}')
		var req struct {
			Params json.RawMessage `json:"params"`
		}
		if jcs.CheckIJSON(body) != nil || json.Unmarshal(body, &req) != nil {
			return
		}
		steps := []domain.Step{{Step: "restart-device", Action: "restart", Target: "device-1", Params: req.Params}}
		canon, _, err := svc.Plan(ctx, steps, "alice")
		if err != nil {
			return // refused when the plan is submitted: fine
		}
		var stored []domain.Step // the plan as the store keeps and reads it
		if err := json.Unmarshal(canon, &stored); err != nil {
			t.Fatalf("stored plan %s: %v", canon, err)
		}
		task := domain.Task{TaskID: "task-1", Approval: &domain.Approval{TaskID: "task-1", Version: 1, Steps: stored}}
		n, err := svc.PrepareStep(ctx, task, 0)
		if err != nil {
			t.Fatalf("an accepted plan's step cannot run: params %s, stored as %s: %v", req.Params, stored[0].Params, err)
		}
		wantParams, _ := domain.CanonicalParams(req.Params)
		if c, err := jcs.Canonicalize(n.Params); err != nil || !bytes.Equal(c, wantParams) {
			t.Fatalf("the step sends %s, another value than %s", n.Params, req.Params)
		}
		direct, err := svc.Prepare(ctx, "op-1", Intent{Target: "device-1", Action: "restart", Params: req.Params})
		if err == nil && direct.RequestHash != n.RequestHash {
			t.Fatalf("params %s: request_hash %s as a step, %s submitted directly", req.Params, n.RequestHash, direct.RequestHash)
		}
	})
}
