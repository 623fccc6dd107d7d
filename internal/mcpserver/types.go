package mcpserver

import (
	"encoding/json"
	"time"
)

// The tools' inputs. Field names are the API's, so that a tool can send
// the call's arguments to the API as they came (see the package doc); the
// schema says their shape, and the API decides what is valid.

// SubmitInput is submit_operation's input: the body of POST /v1/operations.
type SubmitInput struct {
	OperationID     string         `json:"operation_id,omitempty" jsonschema:"the whole operation id ([A-Za-z0-9._:-]{1,200}); leave it out to have it derived as task_id:step:target:business_version"`
	TaskID          string         `json:"task_id,omitempty" jsonschema:"your task's id ([A-Za-z0-9._-]{1,64}), the first part of the derived operation id"`
	Step            string         `json:"step,omitempty" jsonschema:"the step of your task this operation is ([A-Za-z0-9._-]{1,64}), e.g. restart-device"`
	Target          string         `json:"target" jsonschema:"the device id, e.g. device-1001"`
	BusinessVersion string         `json:"business_version,omitempty" jsonschema:"the version of the intent ([A-Za-z0-9._-]{1,64}), e.g. v1; a new intent for the same task, step and target takes the next one (v2)"`
	Action          string         `json:"action" jsonschema:"the device action, e.g. restart or set-config"`
	Params          map[string]any `json:"params,omitempty" jsonschema:"the action's parameters, a JSON object; send the same params on every retry of one intent"`
}

// GetOperationInput is get_operation's input.
type GetOperationInput struct {
	OperationID string `json:"operation_id" jsonschema:"the operation id that submit_operation returned (or that you derived)"`
	Wait        string `json:"wait,omitempty" jsonschema:"block until the operation leaves started or this Go duration passes, at most 60s, e.g. 30s; empty: answer at once"`
}

// CommandInput is the input of get_command and cancel_command.
type CommandInput struct {
	CommandID string `json:"command_id" jsonschema:"the command id, e.g. the command_id of an operation"`
}

// ListDevicesInput is list_devices' input: one page of the fleet.
type ListDevicesInput struct {
	Limit  int    `json:"limit,omitempty" jsonschema:"devices per page, 1 to 10000 (default 1000)"`
	After  string `json:"after,omitempty" jsonschema:"start after this device id: the next_after of the previous page"`
	Online *bool  `json:"online,omitempty" jsonschema:"only devices online (true) or offline (false); absent: both"`
}

// DeviceInput is get_device's input.
type DeviceInput struct {
	DeviceID string `json:"device_id" jsonschema:"the device id, e.g. device-1001"`
}

// StepInput is one step of a plan.
type StepInput struct {
	Step   string         `json:"step" jsonschema:"the step's name ([A-Za-z0-9._-]{1,64}); (step, target) is unique within a plan"`
	Action string         `json:"action" jsonschema:"the device action, e.g. restart"`
	Target string         `json:"target" jsonschema:"the device id"`
	Params map[string]any `json:"params,omitempty" jsonschema:"the action's parameters, a JSON object"`
}

// CreateTaskInput is create_task's input: the body of POST /v1/tasks.
type CreateTaskInput struct {
	TaskID        string      `json:"task_id" jsonschema:"your task's id ([A-Za-z0-9._-]{1,64}); the same task_id and plan again returns the task, another plan under it is refused"`
	Steps         []StepInput `json:"steps" jsonschema:"the plan: the steps a person approves and the controller then runs in order"`
	ExecuteAfter  string      `json:"execute_after,omitempty" jsonschema:"RFC 3339 time: an approved task waits for it (start of the maintenance window)"`
	ExecuteBefore string      `json:"execute_before,omitempty" jsonschema:"RFC 3339 time: an approved task not started by then is rejected (window_missed)"`
}

// UpdatePlanInput is update_plan's input: PUT /v1/tasks/{task_id}/plan.
type UpdatePlanInput struct {
	TaskID      string      `json:"task_id" jsonschema:"the task whose plan to replace; it must still wait for approval"`
	Steps       []StepInput `json:"steps" jsonschema:"the new plan; the same plan as the current one returns the current version"`
	BaseVersion *int        `json:"base_version,omitempty" jsonschema:"the version you revised; if it is no longer the current one the call is refused (409 stale_version)"`
}

// TaskInput is get_task's input.
type TaskInput struct {
	TaskID string `json:"task_id" jsonschema:"the task id"`
}

// RampInput is a rollout's ramp.
type RampInput struct {
	BasePerMinute  int     `json:"base_per_minute" jsonschema:"the start rate, devices started per minute"`
	Factor         float64 `json:"factor" jsonschema:"the rate is multiplied by this each time every_succeeded more devices succeeded"`
	EverySucceeded int     `json:"every_succeeded" jsonschema:"devices succeeded between two steps of the ramp"`
}

// AbortInput is one abort rule of a rollout.
type AbortInput struct {
	When        string  `json:"when" jsonschema:"the outcome counted: failed, timeout, rejected, needs_attention or any"`
	Percent     float64 `json:"percent" jsonschema:"abort once this share (percent) of the finished devices ended so"`
	MinFinished int     `json:"min_finished" jsonschema:"only once at least this many devices finished"`
}

// WindowInput is a recurring maintenance window (UTC).
type WindowInput struct {
	Cron     string `json:"cron" jsonschema:"when the window opens, a cron expression in UTC, e.g. 0 2 * * *"`
	Duration string `json:"duration" jsonschema:"how long it stays open, a Go duration, e.g. 2h"`
}

// CreateRolloutInput is create_rollout's input: the body of POST /v1/rollouts.
type CreateRolloutInput struct {
	RolloutID     string         `json:"rollout_id" jsonschema:"your rollout's id; each device gets the operation {rollout_id}:rollout:{device}:v{version}; the same body again returns the rollout"`
	Action        string         `json:"action" jsonschema:"the device action run on every device"`
	Params        map[string]any `json:"params,omitempty" jsonschema:"the action's parameters, a JSON object"`
	Devices       any            `json:"devices" jsonschema:"a glob over device ids (e.g. device-*) or a list of device ids, resolved once at creation"`
	MaxPerMinute  int            `json:"max_per_minute,omitempty" jsonschema:"devices started per minute at most"`
	Ramp          *RampInput     `json:"ramp,omitempty" jsonschema:"start slower and speed up as devices succeed"`
	MaxInFlight   int            `json:"max_in_flight,omitempty" jsonschema:"devices running at once at most"`
	Abort         []AbortInput   `json:"abort,omitempty" jsonschema:"rules that stop the rollout when too many devices end badly"`
	ExecuteAfter  string         `json:"execute_after,omitempty" jsonschema:"RFC 3339 time: no device starts before it"`
	ExecuteBefore string         `json:"execute_before,omitempty" jsonschema:"RFC 3339 time: no device starts after it"`
	Windows       []WindowInput  `json:"windows,omitempty" jsonschema:"recurring maintenance windows: no device starts outside one"`
	Retries       *int           `json:"retries,omitempty" jsonschema:"how often a device whose operation ended failed_retryable is retried (the same operation id)"`
}

// RolloutInput is get_rollout's input.
type RolloutInput struct {
	RolloutID string `json:"rollout_id" jsonschema:"the rollout id"`
}

// The tools' outputs: typed views of the API's answers (decoded straight
// from its JSON), each with an optional error, set on a tool error alone.

// ToolError is a failed call: the API's status and code, or a transport
// failure (status 0, code unreachable or no_answer).
type ToolError struct {
	Status  int    `json:"status" jsonschema:"the HTTP status of the API's answer; 0 when none came"`
	Code    string `json:"code" jsonschema:"the API's stable error code, e.g. idempotency_key_reused, approval_required, permission_denied, forbidden"`
	Message string `json:"message" jsonschema:"the API's message"`
	Hint    string `json:"hint,omitempty" jsonschema:"what to do about it"`
	InDoubt bool   `json:"in_doubt,omitempty" jsonschema:"true when the request may have reached the controller and done its work: repeat the same call with the same ids, never new ones"`
}

// Failure is embedded in every output.
type Failure struct {
	Error *ToolError `json:"error,omitempty" jsonschema:"set when the call failed (isError); the other fields are then absent"`
}

func (f *Failure) setError(e *ToolError) { f.Error = e }

// Operation is an operation record (the API's, without the lease fields).
type Operation struct {
	OperationID     string          `json:"operation_id" jsonschema:"the operation's id: the idempotency key of the intent"`
	Status          string          `json:"status" jsonschema:"started (in doubt: not final), succeeded, failed_retryable (nothing ran or nothing is known: the same submit retries it) or failed_final"`
	RequestHash     string          `json:"request_hash" jsonschema:"SHA-256 of the canonical {action, target, params}"`
	Action          string          `json:"action"`
	Target          string          `json:"target"`
	Params          json.RawMessage `json:"params" jsonschema:"the params as submitted"`
	Result          json.RawMessage `json:"result" jsonschema:"the device's result once succeeded, else null"`
	Reason          string          `json:"reason,omitempty" jsonschema:"why it failed"`
	CommandID       string          `json:"command_id" jsonschema:"the current command sent to the device (get_command shows its receipts)"`
	CommandIDs      []string        `json:"command_ids" jsonschema:"every command id minted for it, oldest first"`
	Attempt         int             `json:"attempt" jsonschema:"command ids minted for it"`
	TaskID          string          `json:"task_id,omitempty"`
	Step            string          `json:"step,omitempty"`
	BusinessVersion string          `json:"business_version,omitempty"`
	Compensates     string          `json:"compensates,omitempty" jsonschema:"the operation this one compensates"`
	Compensations   []string        `json:"compensations" jsonschema:"operations that compensate this one"`
	StartedAt       time.Time       `json:"started_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
}

// OperationOutput is the output of submit_operation and get_operation.
// Created and InDoubt are pointers so that false is said, not left out:
// a replay answers created false (and in_doubt false once the operation
// left started), as the first submit answers true; a failed call has
// neither (only error).
type OperationOutput struct {
	Operation *Operation `json:"operation,omitempty" jsonschema:"the operation record"`
	Created   *bool      `json:"created,omitempty" jsonschema:"submit_operation: true when this call created the operation (201); false when it existed and the stored record came back (200), nothing run again unless it was failed_retryable"`
	InDoubt   *bool      `json:"in_doubt,omitempty" jsonschema:"true while the status is started: the outcome is not known yet; ask again with get_operation and the same operation_id, never submit a new id; false once it has left started"`
	Next      string     `json:"next,omitempty" jsonschema:"what to do next"`
	Failure
}

// Receipt is one line of a command's receipt log.
type Receipt struct {
	Status     string          `json:"status" jsonschema:"what the device said: received, executing, succeeded, failed, rejected or unknown"`
	Seq        int             `json:"seq"`
	At         string          `json:"at,omitempty" jsonschema:"the device's own time"`
	ReceivedAt time.Time       `json:"received_at"`
	QueryID    string          `json:"query_id,omitempty" jsonschema:"set when it answered a query"`
	Effect     string          `json:"effect" jsonschema:"applied, duplicate, stale, late or mismatch"`
	Error      string          `json:"error,omitempty"`
	Result     json.RawMessage `json:"result,omitempty"`
}

// Event is one state change of a command.
type Event struct {
	At      time.Time `json:"at"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Reason  string    `json:"reason"`
	Refused bool      `json:"refused,omitempty" jsonschema:"a change that was refused (a stale or illegal move)"`
	// Principal: the person whose change it is.
	Principal string `json:"principal,omitempty" jsonschema:"the person whose change it is (a cancel, a resolve); absent for the controller's own"`
}

// Command is a command as the API shows it.
type Command struct {
	CommandID    string          `json:"command_id"`
	OperationID  string          `json:"operation_id"`
	DeviceID     string          `json:"device_id"`
	Action       string          `json:"action"`
	Params       json.RawMessage `json:"params"`
	Status       string          `json:"status" jsonschema:"pending, waiting_device, sent, received, executing, succeeded, failed, timeout, cancelled or needs_attention (a person must resolve it)"`
	Reason       string          `json:"reason,omitempty"`
	Result       json.RawMessage `json:"result"`
	Attempt      int             `json:"attempt" jsonschema:"publishes decided for it; 0: never sent, so it can still be cancelled"`
	Queries      int             `json:"queries"`
	IssuedAt     time.Time       `json:"issued_at"`
	ExpiresAt    time.Time       `json:"expires_at" jsonschema:"it is terminal, or needs_attention, by then"`
	LateOutcome  string          `json:"late_outcome,omitempty" jsonschema:"a final receipt that came after the command ended"`
	LateResult   json.RawMessage `json:"late_result,omitempty"`
	LateConflict bool            `json:"late_conflict" jsonschema:"a late receipt contradicts the recorded outcome: tell a person"`
	ExecutedAs   string          `json:"executed_as,omitempty"`
	ResolvedBy   string          `json:"resolved_by,omitempty"`
	SerialSeq    int64           `json:"serial_seq,omitempty" jsonschema:"a serial command's place in its device's queue; absent for a parallel one"`
	QueuedBehind string          `json:"queued_behind,omitempty" jsonschema:"the serial command just ahead of this one on its device, while this one waits unpublished (reason queued)"`
	Receipts     []Receipt       `json:"receipts"`
	Events       []Event         `json:"events"`
}

// CommandOutput is the output of get_command and cancel_command.
type CommandOutput struct {
	Command *Command `json:"command,omitempty"`
	Next    string   `json:"next,omitempty" jsonschema:"what to do next"`
	Failure
}

// Device is a device's presence.
type Device struct {
	DeviceID     string `json:"device_id"`
	Online       bool   `json:"online"`
	Confirmed    bool   `json:"confirmed" jsonschema:"its presence is confirmed by a birth of its current session"`
	Seen         bool   `json:"seen" jsonschema:"the controller has seen it at least once (tasks need a seen device)"`
	Session      int64  `json:"session"`
	Capabilities struct {
		Dedupe bool `json:"dedupe" jsonschema:"the device executes an operation_id at most once"`
		Query  bool `json:"query" jsonschema:"the device answers queries about a command"`
	} `json:"capabilities"`
	ClockSkewMS int64      `json:"clock_skew_ms"`
	LastSeenAt  *time.Time `json:"last_seen_at"`
}

// DeviceDetail is get_device's device: its presence and its commands.
type DeviceDetail struct {
	Device
	InFlight []string `json:"in_flight" jsonschema:"its commands published and not yet final (needs_attention included), oldest first"`
	Queued   []string `json:"queued" jsonschema:"its serial commands not yet published, in the order they will be published: the first one goes out when nothing serial is in flight"`
}

// DeviceOutput is get_device's output.
type DeviceOutput struct {
	Device *DeviceDetail `json:"device,omitempty"`
	Failure
}

// DevicesOutput is list_devices' output: one page.
type DevicesOutput struct {
	Devices   []Device `json:"devices,omitempty" jsonschema:"this page, by device id"`
	Total     int64    `json:"total,omitempty" jsonschema:"devices that match, over every page"`
	NextAfter string   `json:"next_after,omitempty" jsonschema:"pass as after for the next page; absent on the last page"`
	Failure
}

// TaskStep is a step with its operation id (null before approval).
type TaskStep struct {
	Step        string          `json:"step"`
	Action      string          `json:"action"`
	Target      string          `json:"target"`
	Params      json.RawMessage `json:"params"`
	OperationID *string         `json:"operation_id" jsonschema:"{task_id}:{step}:{target}:approval-v{version} once a version is approved: follow it with get_operation"`
}

// Approval is a person's approval of a plan version.
type Approval struct {
	Version    int       `json:"version"`
	Approver   string    `json:"approver"`
	ApprovedAt time.Time `json:"approved_at"`
	PlanHash   string    `json:"plan_hash"`
}

// HistoryEntry is one line of a task's history.
type HistoryEntry struct {
	At        time.Time `json:"at"`
	Principal string    `json:"principal"`
	Action    string    `json:"action"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Version   int       `json:"version"`
	Reason    string    `json:"reason,omitempty"`
}

// Task is a task as the API shows it.
type Task struct {
	TaskID        string         `json:"task_id"`
	Status        string         `json:"status" jsonschema:"waiting_approval (a person must approve), approved, running, completed, rejected or failed"`
	Reason        string         `json:"reason,omitempty"`
	Version       int            `json:"version" jsonschema:"the current plan version"`
	PlanHash      string         `json:"plan_hash"`
	Requester     string         `json:"requester,omitempty"`
	CreatedBy     string         `json:"created_by"`
	ExecuteAfter  *time.Time     `json:"execute_after"`
	ExecuteBefore *time.Time     `json:"execute_before"`
	Approval      *Approval      `json:"approval"`
	Steps         []TaskStep     `json:"steps"`
	History       []HistoryEntry `json:"history"`
}

// TaskOutput is the output of create_task, update_plan and get_task.
type TaskOutput struct {
	Task    *Task  `json:"task,omitempty"`
	Created *bool  `json:"created,omitempty" jsonschema:"create_task: true when this call created the task (201), false for a replay (200)"`
	Next    string `json:"next,omitempty" jsonschema:"what to do next"`
	Failure
}

// Rollout is a rollout's state: the fields every answer has, and the
// API's whole answer.
type Rollout struct {
	RolloutID    string          `json:"rollout_id"`
	Status       string          `json:"status" jsonschema:"waiting_approval, scheduled, running, paused, succeeded, completed_with_failures, aborted or cancelled"`
	Version      int             `json:"version"`
	DevicesTotal int             `json:"devices_total"`
	Answer       json.RawMessage `json:"answer" jsonschema:"the API's whole answer: counts by device outcome, rate, history"`
}

// RolloutOutput is the output of create_rollout and get_rollout.
type RolloutOutput struct {
	Rollout *Rollout `json:"rollout,omitempty"`
	Created *bool    `json:"created,omitempty" jsonschema:"create_rollout: true when this call created it (201), false for a replay (200)"`
	Next    string   `json:"next,omitempty" jsonschema:"what to do next"`
	Failure
}
