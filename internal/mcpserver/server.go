package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"reflect"
	"strconv"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// Tool names, as the contract lists them. There is no approve tool.
const (
	ToolSubmitOperation = "submit_operation"
	ToolGetOperation    = "get_operation"
	ToolGetCommand      = "get_command"
	ToolListDevices     = "list_devices"
	ToolGetDevice       = "get_device"
	ToolCreateTask      = "create_task"
	ToolUpdatePlan      = "update_plan"
	ToolGetTask         = "get_task"
	ToolCreateRollout   = "create_rollout"
	ToolGetRollout      = "get_rollout"
	ToolCancelCommand   = "cancel_command"
)

// Config configures the tool server.
type Config struct {
	// Client returns the API client that one tool call uses: the daemon
	// at --server with --token (Serve), or the API in process with the
	// caller's Authorization (HTTPHandler).
	Client func(req *mcp.CallToolRequest) *client.Client
	// Logger gets a debug line per tool call; nil: discarded.
	Logger *slog.Logger
	// Version is the server's version in the MCP handshake.
	Version string
}

// operationIDRules is what every tool that names an operation teaches.
const operationIDRules = `Operation ids: an operation is named task_id:step:target:business_version. Give those parts ` +
	`(each [A-Za-z0-9._-]{1,64}, no ':') and the controller derives the id, or give the whole operation_id ` +
	`([A-Za-z0-9._:-]{1,200}). Derive it from your task and its step, never from the time or a random number: ` +
	`every retry of one intent (after a timeout, an error, a lost answer, your own restart) sends the same id with ` +
	`the same action, target and params, and nothing runs twice. A new intent (the user really wants it done again) ` +
	`gets a new id, e.g. the next business_version (v2). The same id with other params is refused ` +
	`(422 idempotency_key_reused) and changes nothing. Ids ending in :approval-v<N> belong to approved tasks, ` +
	`ids of the shape {rollout_id}:rollout:{device}:v<N> to rollouts (403 reserved_operation_id).`

// inDoubtRule is what every tool that returns an operation teaches.
const inDoubtRule = `A result whose status is still "started" is in doubt: the device may or may not have acted yet. ` +
	`Ask again with get_operation and the same operation_id (with wait, e.g. "30s"), as often as it takes; ` +
	`never submit a new operation_id for it. failed_retryable means nothing ran or nothing is known: the same ` +
	`submit_operation call (same id, same params) retries it safely, the controller asking the device first.`

// Instructions are sent to the agent host at the handshake.
const Instructions = `Tools of a device-command controller: every call goes through its HTTP API with your token, ` +
	`so its rules (idempotency, approvals, grants, roles) are the tools' rules. ` + operationIDRules + " " + inDoubtRule +
	` Actions that need approval (403 approval_required) run only through a task: create_task, then a person ` +
	`approves it; there is no tool that approves. Errors come back as tool errors with the API's code ` +
	`(idempotency_key_reused, approval_required, permission_denied, forbidden, ...) and a hint.`

var (
	yes = new(true)
	no  = new(false)
)

// New builds the tool server.
func New(cfg Config) *mcp.Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "fleetctl-controller", Title: "fleetctl device-command controller",
		Version: cfg.Version}, &mcp.ServerOptions{Instructions: Instructions})
	read := func(title string) *mcp.ToolAnnotations {
		return &mcp.ToolAnnotations{Title: title, ReadOnlyHint: true, DestructiveHint: no, IdempotentHint: true, OpenWorldHint: no}
	}
	add(s, cfg, &mcp.Tool{Name: ToolSubmitOperation,
		Description: `Ask a device to do something (POST /v1/operations): the action runs on the real device, ` +
			`once per operation id. ` + operationIDRules + " " + inDoubtRule +
			` An action whose policy needs approval is refused (403 approval_required): use create_task. ` +
			`A missing grant is 403 permission_denied; a token without the operator role is 403 forbidden.`,
		Annotations: &mcp.ToolAnnotations{Title: "Submit an operation to a device", DestructiveHint: yes,
			IdempotentHint: true, OpenWorldHint: yes},
	}, submitOperation)
	add(s, cfg, &mcp.Tool{Name: ToolGetOperation,
		Description: `Read an operation by its id (GET /v1/operations/{id}); with wait (a Go duration up to 60s, ` +
			`e.g. "30s") it blocks until the operation leaves started or the wait ends. ` + inDoubtRule +
			` 404 not_found: no operation has this id (if you submitted it and got no answer, send the same ` +
			`submit_operation again).`,
		Annotations: read("Read an operation (optionally wait for its outcome)"),
	}, getOperation)
	add(s, cfg, &mcp.Tool{Name: ToolGetCommand,
		Description: `Read a command, the message sent to the device for an operation (GET /v1/commands/{id}): ` +
			`its status, attempts, expiry, the device's receipts (with their effect) and its state changes. ` +
			`needs_attention means a person must decide what happened; there is no tool for that.`,
		Annotations: read("Read a command and its receipts"),
	}, getCommand)
	add(s, cfg, &mcp.Tool{Name: ToolListDevices,
		Description: `List one page of the fleet by device id (GET /v1/devices): online, confirmed, seen, ` +
			`session, capabilities, clock skew. Pass next_after as after for the next page.`,
		Annotations: read("List devices"),
	}, listDevices)
	add(s, cfg, &mcp.Tool{Name: ToolGetDevice,
		Description: `Read one device's presence (GET /v1/devices/{id}); a device never seen reads as offline. ` +
			`Also its commands in flight and its queue of serial commands waiting their turn (in_flight, queued).`,
		Annotations: read("Read a device"),
	}, getDevice)
	add(s, cfg, &mcp.Tool{Name: ToolCreateTask,
		Description: `Propose a plan for a person to approve (POST /v1/tasks): version 1 of the task's plan, ` +
			`which waits for approval. There is no tool that approves: a person approves through the API, the CLI ` +
			`or the dashboard; then the controller runs each step as the operation ` +
			`{task_id}:{step}:{target}:approval-v{version}, which get_task lists and get_operation follows. ` +
			`The same task_id with the same plan returns the task (a safe retry); another plan under the same ` +
			`task_id is refused (422 idempotency_key_reused): change a plan with update_plan. Each step needs a ` +
			`grant for its action on its device (403 permission_denied) and the operator role (403 forbidden).`,
		Annotations: &mcp.ToolAnnotations{Title: "Create a task that waits for approval", DestructiveHint: no,
			IdempotentHint: true, OpenWorldHint: no},
	}, createTask)
	add(s, cfg, &mcp.Tool{Name: ToolUpdatePlan,
		Description: `Propose a new plan version for a task still waiting for approval (PUT /v1/tasks/{id}/plan); ` +
			`the new version supersedes the old one, which can no longer be approved. The same plan as the current ` +
			`one returns the current version (a safe retry). base_version, if given and no longer current, is ` +
			`refused (409 stale_version); a task that left waiting_approval is 409 illegal_state.`,
		Annotations: &mcp.ToolAnnotations{Title: "Propose a new plan version", DestructiveHint: no,
			IdempotentHint: true, OpenWorldHint: no},
	}, updatePlan)
	add(s, cfg, &mcp.Tool{Name: ToolGetTask,
		Description: `Read a task (GET /v1/tasks/{id}): status (waiting_approval until a person approves), plan ` +
			`version and hash, the approval, each step with its operation_id (null before approval) and the ` +
			`history. Follow a step's operation_id with get_operation and wait.`,
		Annotations: read("Read a task"),
	}, getTask)
	add(s, cfg, &mcp.Tool{Name: ToolCreateRollout,
		Description: `Run one action across many devices at a bounded rate (POST /v1/rollouts). The device set ` +
			`(a glob or a list) is resolved once; each device gets the operation ` +
			`{rollout_id}:rollout:{device}:v{version} and starts at most once per version. The same body under the ` +
			`same rollout_id returns the rollout (a safe retry); another body is refused (422 ` +
			`idempotency_key_reused). An action that needs approval makes the rollout wait for a person.`,
		Annotations: &mcp.ToolAnnotations{Title: "Create a rollout across the fleet", DestructiveHint: yes,
			IdempotentHint: true, OpenWorldHint: yes},
	}, createRollout)
	add(s, cfg, &mcp.Tool{Name: ToolGetRollout,
		Description: `Read a rollout (GET /v1/rollouts/{id}): status, version, devices_total and the API's whole ` +
			`answer (counts by device outcome, rate, history).`,
		Annotations: read("Read a rollout"),
	}, getRollout)
	add(s, cfg, &mcp.Tool{Name: ToolCancelCommand,
		Description: `Cancel a command that was never sent to its device (POST /v1/commands/{id}/cancel); its ` +
			`operation then ends failed_final (reason cancelled), for good. A command already sent cannot be ` +
			`cancelled (409 already_published): follow it with get_command. Cancelling a cancelled command ` +
			`returns it again.`,
		Annotations: &mcp.ToolAnnotations{Title: "Cancel a command not yet sent", DestructiveHint: yes,
			IdempotentHint: true, OpenWorldHint: no},
	}, cancelCommand)
	return s
}

// viaMCP is c marked as the MCP server's (client.Client.Via): an
// operation a tool submits records via mcp, and the principal of c's
// token as its submitter.
func viaMCP(c *client.Client) *client.Client {
	mc := *c
	mc.Via = domain.ViaMCP
	return &mc
}

// call is the API client and the raw arguments of one tool call.
type call struct {
	c   *client.Client
	raw json.RawMessage
}

// body is the call's arguments as the agent sent them, for the API.
func (k call) body() json.RawMessage {
	if len(k.raw) == 0 {
		return json.RawMessage("{}")
	}
	return k.raw
}

// toolFunc is one tool: it returns its output and the line of text that
// tells the agent what the output means, or an error.
type toolFunc[In, Out any] func(ctx context.Context, k call, in In) (Out, string, error)

// errorSetter is implemented by every output through its Failure.
type errorSetter[Out any] interface {
	*Out
	setError(*ToolError)
}

// add registers a tool with schemas inferred from In and Out, and turns
// its error into a tool error with the API's code.
func add[In, Out any, P errorSetter[Out]](s *mcp.Server, cfg Config, t *mcp.Tool, fn toolFunc[In, Out]) {
	t.InputSchema = schemaFor[In]()
	t.OutputSchema = schemaFor[Out]()
	mcp.AddTool(s, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		k := call{c: viaMCP(cfg.Client(req))}
		if req.Params != nil {
			k.raw = req.Params.Arguments
		}
		out, line, err := fn(ctx, k, in)
		if err != nil {
			te := toolError(err, t.Name)
			cfg.Logger.Debug("mcp tool call failed", "tool", t.Name, "status", te.Status, "code", te.Code)
			var failed Out
			P(&failed).setError(te)
			return &mcp.CallToolResult{IsError: true, Content: text(te.text(), failed)}, failed, nil
		}
		cfg.Logger.Debug("mcp tool call", "tool", t.Name)
		return &mcp.CallToolResult{Content: text(line, out)}, out, nil
	})
}

// text is a result's unstructured content: the line for the agent, then
// the output's JSON (as the spec suggests for clients that do not read
// structured content).
func text(line string, out any) []mcp.Content {
	b, err := wire.Encode(out)
	if err != nil {
		b = []byte(`{}`)
	}
	return []mcp.Content{&mcp.TextContent{Text: line}, &mcp.TextContent{Text: string(b)}}
}

// schemaFor infers T's JSON schema; a json.RawMessage field (params,
// results: any JSON value) is any value rather than the bytes' array.
func schemaFor[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](&jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[json.RawMessage](): {},
	}})
	if err != nil {
		panic(fmt.Sprintf("mcpserver: schema of %T: %v", *new(T), err))
	}
	if p, ok := s.Properties["devices"]; ok && reflect.TypeFor[T]() == reflect.TypeFor[CreateRolloutInput]() {
		s.Properties["devices"] = &jsonschema.Schema{Description: p.Description, AnyOf: []*jsonschema.Schema{
			{Type: "string"}, {Type: "array", Items: &jsonschema.Schema{Type: "string"}}}}
	}
	return s
}

// The tools.

func submitOperation(ctx context.Context, k call, _ SubmitInput) (OperationOutput, string, error) {
	var op Operation
	status, err := k.c.Do(ctx, http.MethodPost, "/v1/operations", nil, k.body(), &op)
	if err != nil {
		return OperationOutput{}, "", inDoubt(err)
	}
	out, line := operationOutput(op)
	out.Created = new(status == http.StatusCreated)
	if !*out.Created {
		line = "This operation_id existed: the stored record came back and nothing ran again. " + line
	}
	return out, line, nil
}

func getOperation(ctx context.Context, k call, in GetOperationInput) (OperationOutput, string, error) {
	path := "/v1/operations/" + url.PathEscape(in.OperationID)
	if in.Wait != "" {
		path += "?wait=" + url.QueryEscape(in.Wait)
	}
	var op Operation
	if _, err := k.c.Do(ctx, http.MethodGet, path, nil, nil, &op); err != nil {
		return OperationOutput{}, "", err
	}
	out, line := operationOutput(op)
	return out, line, nil
}

// operationOutput says what an operation's status means to the agent.
func operationOutput(op Operation) (OperationOutput, string) {
	out := OperationOutput{Operation: &op, InDoubt: new(op.Status == "started")}
	id := op.OperationID
	switch op.Status {
	case "started":
		out.Next = fmt.Sprintf(`in doubt: ask again with get_operation {"operation_id":%q,"wait":"30s"}; never submit a new operation_id for this intent`, id)
		return out, fmt.Sprintf("Operation %s is started: in doubt, the device may or may not have acted yet. "+
			`Ask again with get_operation {"operation_id":%q,"wait":"30s"} (the same id, as often as it takes); `+
			"never submit a new operation_id for this intent.", id, id)
	case "succeeded":
		out.Next = "done: result holds the device's answer; the same submit returns this record and runs nothing"
		return out, fmt.Sprintf("Operation %s succeeded; result holds the device's answer.", id)
	case "failed_retryable":
		out.Next = "nothing ran or nothing is known: to retry, call submit_operation again with the same operation_id and the same params"
		return out, fmt.Sprintf("Operation %s is failed_retryable (%s): nothing ran or nothing is known. To retry it, "+
			"call submit_operation again with the same operation_id and params (the controller asks the device first).", id, op.Reason)
	case "failed_final":
		out.Next = "final: the same submit returns this record; doing it again is a new intent with a new operation_id"
		return out, fmt.Sprintf("Operation %s is failed_final (%s). The same submit returns this record; doing it "+
			"again is a new intent with a new operation_id (e.g. the next business_version).", id, op.Reason)
	}
	return out, fmt.Sprintf("Operation %s is %s.", id, op.Status)
}

func getCommand(ctx context.Context, k call, in CommandInput) (CommandOutput, string, error) {
	var c Command
	if _, err := k.c.Do(ctx, http.MethodGet, "/v1/commands/"+url.PathEscape(in.CommandID), nil, nil, &c); err != nil {
		return CommandOutput{}, "", err
	}
	return commandOutput(c)
}

func cancelCommand(ctx context.Context, k call, in CommandInput) (CommandOutput, string, error) {
	var c Command
	if _, err := k.c.Do(ctx, http.MethodPost, "/v1/commands/"+url.PathEscape(in.CommandID)+"/cancel", nil, nil, &c); err != nil {
		return CommandOutput{}, "", err
	}
	return commandOutput(c)
}

func commandOutput(c Command) (CommandOutput, string, error) {
	out := CommandOutput{Command: &c}
	switch {
	case c.Status == "cancelled":
		out.Next = "cancelled, never sent: its operation " + c.OperationID + " is failed_final (reason cancelled)"
	case c.Status == "needs_attention":
		out.Next = "a person must resolve it: the device's outcome is not known and it will not be re-sent"
	case c.Attempt == 0 && (c.Status == "pending" || c.Status == "waiting_device"):
		out.Next = "not sent yet: cancel_command can still cancel it; else follow operation " + c.OperationID + " with get_operation"
	default:
		out.Next = "follow operation " + c.OperationID + " with get_operation and wait"
	}
	line := fmt.Sprintf("Command %s (operation %s, device %s) is %s: %s.", c.CommandID, c.OperationID, c.DeviceID, c.Status, out.Next)
	if c.LateConflict {
		line += " A late receipt contradicts its recorded outcome: tell a person."
	}
	return out, line, nil
}

func listDevices(ctx context.Context, k call, in ListDevicesInput) (DevicesOutput, string, error) {
	v := url.Values{}
	if in.Limit != 0 {
		v.Set("limit", strconv.Itoa(in.Limit))
	}
	if in.After != "" {
		v.Set("after", in.After)
	}
	if in.Online != nil {
		v.Set("online", strconv.FormatBool(*in.Online))
	}
	path := "/v1/devices"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	devs, page, err := k.c.DevicesPage(ctx, path)
	if err != nil {
		return DevicesOutput{}, "", err
	}
	out := DevicesOutput{Devices: make([]Device, 0, len(devs)), Total: page.Total}
	if err := recast(devs, &out.Devices); err != nil {
		return DevicesOutput{}, "", err
	}
	if page.Next != "" {
		if u, err := url.Parse(page.Next); err == nil {
			out.NextAfter = u.Query().Get("after")
		}
	}
	online := 0
	for _, d := range out.Devices {
		if d.Online {
			online++
		}
	}
	line := fmt.Sprintf("%d devices on this page (%d online), %d in all.", len(out.Devices), online, out.Total)
	if out.NextAfter != "" {
		line += fmt.Sprintf(` More: call list_devices with after %q.`, out.NextAfter)
	}
	return out, line, nil
}

func getDevice(ctx context.Context, k call, in DeviceInput) (DeviceOutput, string, error) {
	var d DeviceDetail
	if _, err := k.c.Do(ctx, http.MethodGet, "/v1/devices/"+url.PathEscape(in.DeviceID), nil, nil, &d); err != nil {
		return DeviceOutput{}, "", err
	}
	state := "offline"
	if d.Online {
		state = "online"
	}
	if !d.Seen {
		state = "never seen"
	}
	return DeviceOutput{Device: &d}, fmt.Sprintf("Device %s is %s (session %d), %d commands in flight, %d queued.",
		d.DeviceID, state, d.Session, len(d.InFlight), len(d.Queued)), nil
}

func createTask(ctx context.Context, k call, _ CreateTaskInput) (TaskOutput, string, error) {
	var t Task
	status, err := k.c.Do(ctx, http.MethodPost, "/v1/tasks", nil, k.body(), &t)
	if err != nil {
		return TaskOutput{}, "", inDoubt(err)
	}
	out, line := taskOutput(t)
	out.Created = new(status == http.StatusCreated)
	if !*out.Created {
		line = "This task existed with the same plan: it came back unchanged. " + line
	}
	return out, line, nil
}

func updatePlan(ctx context.Context, k call, in UpdatePlanInput) (TaskOutput, string, error) {
	// The body is the arguments less task_id, the steps as sent.
	var raw struct {
		Steps       json.RawMessage `json:"steps"`
		BaseVersion json.RawMessage `json:"base_version,omitempty"`
	}
	if err := json.Unmarshal(k.body(), &raw); err != nil {
		return TaskOutput{}, "", err
	}
	var t Task
	if _, err := k.c.Do(ctx, http.MethodPut, "/v1/tasks/"+url.PathEscape(in.TaskID)+"/plan", nil, raw, &t); err != nil {
		return TaskOutput{}, "", inDoubt(err)
	}
	out, line := taskOutput(t)
	return out, line, nil
}

func getTask(ctx context.Context, k call, in TaskInput) (TaskOutput, string, error) {
	var t Task
	if _, err := k.c.Do(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(in.TaskID), nil, nil, &t); err != nil {
		return TaskOutput{}, "", err
	}
	out, line := taskOutput(t)
	return out, line, nil
}

// taskOutput says what a task's status means to the agent.
func taskOutput(t Task) (TaskOutput, string) {
	out := TaskOutput{Task: &t}
	switch t.Status {
	case "waiting_approval":
		out.Next = fmt.Sprintf("a person must approve version %d (API, CLI or dashboard); there is no approve tool: call get_task again later", t.Version)
	case "approved", "running":
		out.Next = `follow each step's operation_id with get_operation {"operation_id":...,"wait":"30s"}`
	case "completed":
		out.Next = "done: every step's operation succeeded"
	default:
		out.Next = "nothing more runs for this task; another attempt is a new task"
	}
	line := fmt.Sprintf("Task %s is %s (plan version %d", t.TaskID, t.Status, t.Version)
	if t.Reason != "" {
		line += ", reason " + t.Reason
	}
	return out, line + "): " + out.Next + "."
}

func createRollout(ctx context.Context, k call, _ CreateRolloutInput) (RolloutOutput, string, error) {
	var answer json.RawMessage
	status, err := k.c.Do(ctx, http.MethodPost, "/v1/rollouts", nil, k.body(), &answer)
	if err != nil {
		return RolloutOutput{}, "", inDoubt(err)
	}
	out, line, err := rolloutOutput(answer)
	out.Created = new(status == http.StatusCreated)
	return out, line, err
}

func getRollout(ctx context.Context, k call, in RolloutInput) (RolloutOutput, string, error) {
	var answer json.RawMessage
	if _, err := k.c.Do(ctx, http.MethodGet, "/v1/rollouts/"+url.PathEscape(in.RolloutID), nil, nil, &answer); err != nil {
		return RolloutOutput{}, "", err
	}
	return rolloutOutput(answer)
}

func rolloutOutput(answer json.RawMessage) (RolloutOutput, string, error) {
	var r Rollout
	if err := json.Unmarshal(answer, &r); err != nil {
		return RolloutOutput{}, "", fmt.Errorf("decode the rollout: %w", err)
	}
	r.Answer = answer
	out := RolloutOutput{Rollout: &r}
	switch r.Status {
	case "waiting_approval":
		out.Next = "a person must approve it; there is no approve tool: call get_rollout again later"
	case "succeeded", "completed_with_failures", "aborted", "cancelled":
		out.Next = "finished: nothing more starts"
	default:
		out.Next = "follow it with get_rollout"
	}
	return out, fmt.Sprintf("Rollout %s is %s (version %d, %d devices): %s.", r.RolloutID, r.Status, r.Version, r.DevicesTotal, out.Next), nil
}

// recast copies src into dst through JSON (the API's type into the tool's).
func recast(src, dst any) error {
	b, err := json.Marshal(src)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, dst)
}

// Errors.

// noAnswer: a change whose request went out and whose answer did not come.
type noAnswer struct{ err error }

func (e *noAnswer) Error() string { return e.err.Error() }
func (e *noAnswer) Unwrap() error { return e.err }

// inDoubt marks a transport failure of a change as in doubt: the request
// may have been committed. An API error or an unreachable controller is
// not (an answer came; nothing was sent).
func inDoubt(err error) error {
	var ae *client.Error
	var ue *client.UnreachableError
	if errors.As(err, &ae) || errors.As(err, &ue) {
		return err
	}
	return &noAnswer{err}
}

// hints say what to do about each API error code.
var hints = map[string]string{
	"idempotency_key_reused": "This id already names another intent (other action, target, params or plan); nothing changed. " +
		"A retry of the same intent must send exactly the original arguments; a new intent needs a new id (e.g. the next business_version).",
	"approval_required": "This action needs a person's approval: propose it with create_task, then a person approves it " +
		"(there is no approve tool) and get_task shows the step's operation_id.",
	"permission_denied":     "Your principal holds no grant for this action on this device. Do not retry; ask an administrator for a grant.",
	"permission_revoked":    "The requester's grant was revoked; nothing ran.",
	"forbidden":             "Your token lacks the role this needs (operator to submit, cancel, create tasks and change plans). Do not retry with other ids.",
	"unauthorized":          "The token is missing or not valid: configure the MCP server with a valid --token (CONTROLLER_TOKEN).",
	"reserved_operation_id": "Ids ending in :approval-v<N> belong to approved tasks, ids of the shape {rollout_id}:rollout:{device}:v<N> to rollouts; choose another id (or business_version).",
	"not_found":             "Nothing has this id. For an operation you submitted without an answer: send the same submit_operation again.",
	"stale_version":         "The task moved on: read it with get_task and revise its current version.",
	"illegal_state":         "Not allowed in the current state: read the record again (get_task, get_command).",
	"already_published":     "The command was already sent to the device and cannot be cancelled: follow it with get_command.",
	"overloaded":            "The controller is saturated: repeat the same call (the same ids) in a second.",
	"unavailable":           "The controller could not finish the call: repeat the same call with the same ids; nothing runs twice.",
	"invalid_wait":          `wait takes a Go duration up to 60s, e.g. "30s".`,
	"too_large":             "The params are too large for a command.",
	"four_eyes":             "The approver wrote this version; another person must approve.",
}

// toolError turns an error of a tool into what the agent sees.
func toolError(err error, tool string) *ToolError {
	var ae *client.Error
	var ue *client.UnreachableError
	var na *noAnswer
	switch {
	case errors.As(err, &ae):
		te := &ToolError{Status: ae.Status, Code: ae.Code, Message: ae.Message, Hint: hints[ae.Code]}
		if te.Hint == "" && ae.Status >= 400 && ae.Status < 500 {
			te.Hint = "The controller refused the call as it is; fix the arguments before sending it again."
		}
		if ae.Status >= 500 {
			te.InDoubt = true
		}
		return te
	case errors.As(err, &ue):
		return &ToolError{Code: "unreachable", Message: ue.Error(),
			Hint: "Nothing was sent: the controller is not reachable. Repeat the same call once it is."}
	case errors.As(err, &na):
		te := &ToolError{Code: "no_answer", Message: err.Error(), InDoubt: true,
			Hint: "The request went out and no answer came: it may have been done. Repeat the same call with the same ids (never new ones)."}
		if tool == ToolSubmitOperation {
			te.Hint += " For an operation, get_operation with its id tells what became of it."
		}
		return te
	}
	return &ToolError{Code: "no_answer", Message: err.Error(), InDoubt: true,
		Hint: "No usable answer came. Repeat the same call with the same ids."}
}

// text is the tool error's text: the status and the API's code first.
func (e *ToolError) text() string {
	s := e.Code + ": " + e.Message
	if e.Status != 0 {
		s = strconv.Itoa(e.Status) + " " + s
	}
	if e.Hint != "" {
		s += "\n" + e.Hint
	}
	return s
}
