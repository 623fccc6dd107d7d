package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/fsm"
	"github.com/fleetctl/fleetctl/internal/store"
)

// GET /v1/openapi.json is an OpenAPI 3.1 document of every route. It is
// built once, in process, from two things: apiRoutes below (what a person
// must say of each route: its parameters, its bodies' Go types, its
// statuses) and the apiwire types themselves, reflected into JSON Schemas
// (2020-12, the dialect of OpenAPI 3.1) by the rules of encoding/json. So a
// field added to a wire type is in the document with no hand work, and the
// tests (openapi_test.go) check that the routes served and the routes
// documented are the same, both ways, and that real answers validate.
//
// It is served without a token, like /healthz, /metrics and /ui/: it says
// nothing of the fleet, only the shape of the API this binary serves, and a
// client generator reads it before anyone holds a token. It says what this
// server asks: with --tokens a bearer token on every other route (and 401
// among their answers), without --tokens none.

// routeMux is the ServeMux that remembers the patterns registered on it,
// so that the document's test enumerates the routes actually served.
type routeMux struct {
	*http.ServeMux
	mu       sync.Mutex
	patterns []string
}

func newRouteMux() *routeMux { return &routeMux{ServeMux: http.NewServeMux()} }

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.mu.Lock()
	m.patterns = append(m.patterns, pattern)
	m.mu.Unlock()
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// Routes lists the patterns of every route registered, as net/http has
// them ("GET /v1/devices/{id}", "/mcp", and "/": the 404/405 catch-all).
func (s *Server) Routes() []string {
	s.mux.mu.Lock()
	defer s.mux.mu.Unlock()
	return slices.Clone(s.mux.patterns)
}

// handleOpenAPI answers the document of this server: with --tokens every
// route but the public ones needs a bearer token; without, none does.
func (s *Server) handleOpenAPI(*http.Request) (int, any, error) {
	doc, err := OpenAPI(s.cfg.Auth.Enabled())
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, json.RawMessage(doc), nil
}

var (
	openapiWithTokens    = sync.OnceValues(func() ([]byte, error) { return json.Marshal(buildOpenAPI(true)) })
	openapiWithoutTokens = sync.OnceValues(func() ([]byte, error) { return json.Marshal(buildOpenAPI(false)) })
)

// OpenAPI returns the document (JSON) of a server with tokens or without,
// built once.
func OpenAPI(tokens bool) ([]byte, error) {
	if tokens {
		return openapiWithTokens()
	}
	return openapiWithoutTokens()
}

// apiParam is one query or header parameter of a route.
type apiParam struct {
	name, in, doc string
	schema        map[string]any
	required      bool
}

// apiRoute documents one route. pattern is as the mux has it, or for /mcp
// (served for any method) the method documented.
type apiRoute struct {
	pattern, summary string
	role             string // "" any valid token; "-" no token needed
	queryToken       bool   // the token may come as ?access_token= too
	params           []apiParam
	// body is the request body's type (nil: none); optionalBody: it may be
	// absent (an empty object when given).
	body         any
	optionalBody bool
	// ok is each success status and its body's type (nil: none); okMedia
	// is the success media type when not JSON.
	ok      map[int]any
	okMedia string
	// list: a paged list (X-Total-Count, Link); errs: the statuses of its
	// refusals beyond those every route of its kind has.
	list bool
	errs []int
}

// Schemas of parameters.
var (
	limitParam = apiParam{name: "limit", in: "query", doc: fmt.Sprintf("page size, 1 to %d (%d when absent)", store.MaxPageLimit, store.DefaultPageLimit),
		schema: map[string]any{"type": "integer", "minimum": 1, "maximum": store.MaxPageLimit, "default": store.DefaultPageLimit}}
	afterParam = apiParam{name: "after", in: "query", doc: "the last id of the previous page (from the Link header); absent or empty: the start",
		schema: map[string]any{"type": "string", "pattern": cursorRule + "|^$"}}
	boolParam = func(name, doc string) apiParam {
		return apiParam{name: name, in: "query", doc: doc, schema: map[string]any{"type": "string", "enum": []string{"true", "false", "1", "0"}}}
	}
	statusParam = func(doc string, states []string) apiParam {
		return apiParam{name: "status", in: "query", doc: doc, schema: map[string]any{"type": "string", "enum": states}}
	}
)

// The lists of the operators' view (the contract's "Operators' view"):
// default 100, at most 1,000, an opaque cursor.
var (
	opsLimitParam = apiParam{name: "limit", in: "query", doc: "page size, 1 to 1000 (100 when absent)",
		schema: map[string]any{"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}}
	opsAfterParam = apiParam{name: "after", in: "query", doc: "an opaque cursor, from the Link header of the previous page",
		schema: map[string]any{"type": "string"}}
	timeParam = func(name, doc string) apiParam {
		return apiParam{name: name, in: "query", doc: doc, schema: map[string]any{"type": "string", "format": "date-time"}}
	}
	textParam = func(name, doc string) apiParam {
		return apiParam{name: name, in: "query", doc: doc, schema: map[string]any{"type": "string"}}
	}
	repeatedStatus = func(doc string, states []string) apiParam {
		return apiParam{name: "status", in: "query", doc: doc + " (repeatable, or comma-separated; open: every non-terminal state)",
			schema: map[string]any{"type": "array", "items": map[string]any{"type": "string",
				"pattern": "^(" + strings.Join(append(states, "open"), "|") + ")(,(" + strings.Join(append(states, "open"), "|") + "))*$"}}}
	}
)

// emptyBody is the body of the routes that take none or an empty object.
type emptyBody struct{}

// health is the body of GET /healthz.
type health struct {
	Status   string `json:"status"`
	Instance string `json:"instance"`
	Reason   string `json:"reason,omitempty"`
}

func states[S ~string](m *fsm.Machine[S]) []string {
	var out []string
	for _, s := range m.States() {
		out = append(out, string(s))
	}
	return out
}

// apiRoutes is every route the server answers, documented. The test
// checks it against the mux's patterns both ways.
func apiRoutes() []apiRoute {
	op, cmd, task := &apiwire.Operation{}, &apiwire.Command{}, &apiwire.TaskView{}
	ro := &apiwire.RolloutView{}
	created := func(v any) map[int]any { return map[int]any{http.StatusOK: v, http.StatusCreated: v} }
	ok := func(v any) map[int]any { return map[int]any{http.StatusOK: v} }
	return []apiRoute{
		{pattern: "POST /v1/operations", summary: "Submit an operation (201 new, 200 the same intent again)", role: RoleOperator,
			params: []apiParam{{name: "Idempotency-Key", in: "header", doc: "supplies the operation_id, or must equal it", schema: map[string]any{"type": "string"}}},
			body:   &apiwire.SubmitRequest{}, ok: created(op), errs: []int{403, 404, 409, 422}},
		{pattern: "GET /v1/operations/{id}", summary: "Read an operation; ?wait= blocks until it leaves started",
			params: []apiParam{{name: "wait", in: "query", doc: "a Go duration up to 60s (400 invalid_wait otherwise)", schema: map[string]any{"type": "string"}}},
			ok:     ok(op), errs: []int{404}},
		{pattern: "POST /v1/operations/{id}/compensations", summary: "Compensate a final operation", role: RoleOperator,
			body: &apiwire.CompensationRequest{}, ok: created(op), errs: []int{403, 404, 409, 422}},
		{pattern: "GET /v1/commands/{id}", summary: "Read a command with its receipts and events", ok: ok(cmd), errs: []int{404}},
		{pattern: "POST /v1/commands/{id}/cancel", summary: "Cancel a command never published", role: RoleOperator,
			body: &emptyBody{}, optionalBody: true, ok: ok(cmd), errs: []int{404, 409}},
		{pattern: "POST /v1/commands/{id}/resolve", summary: "Resolve a command in needs_attention", role: RoleOperator,
			body: &apiwire.ResolveRequest{}, ok: ok(cmd), errs: []int{404, 409}},
		{pattern: "GET /v1/devices", summary: "List devices by id", list: true,
			params: []apiParam{limitParam, afterParam, boolParam("online", "only the devices online (true) or offline (false)")},
			ok:     ok(&[]apiwire.Device{})},
		{pattern: "GET /v1/devices/{id}", summary: "Read a device's presence and its commands in flight and queued (a device never seen: offline, no capabilities)", ok: ok(&apiwire.DeviceDetail{})},
		{pattern: "POST /v1/devices/{id}/presence/reset", summary: "Forget a device's stored presence rank", role: RoleAdmin,
			body: &emptyBody{}, optionalBody: true, ok: ok(&apiwire.Device{}), errs: []int{404}},
		{pattern: "POST /v1/tasks", summary: "Create a task with its plan", role: RoleOperator,
			body: &apiwire.TaskRequest{}, ok: created(task), errs: []int{403, 409, 422}},
		{pattern: "GET /v1/tasks", summary: "List tasks by id", list: true,
			params: []apiParam{limitParam, afterParam, statusParam("only the tasks in this state", states(fsm.Task))},
			ok:     ok(&[]apiwire.TaskListItem{})},
		{pattern: "GET /v1/tasks/{id}", summary: "Read a task with its steps and history", ok: ok(task), errs: []int{404}},
		{pattern: "PUT /v1/tasks/{id}/plan", summary: "Change a task's plan (a new version)", role: RoleOperator,
			body: &apiwire.PlanRequest{}, ok: ok(task), errs: []int{403, 404, 409}},
		{pattern: "POST /v1/tasks/{id}/approvals", summary: "Approve a version of a task's plan (201 first, 200 an exact replay)", role: RoleApprover,
			body: &apiwire.ApprovalRequest{}, ok: created(&apiwire.ApprovalV{}), errs: []int{404, 409}},
		{pattern: "POST /v1/tasks/{id}/rejections", summary: "Reject a task", role: RoleApprover,
			body: &apiwire.RejectionRequest{}, ok: ok(task), errs: []int{404, 409}},
		{pattern: "POST /v1/grants", summary: "Grant a principal an action on devices (201 new, 200 the live one again)", role: RoleAdmin,
			body: &apiwire.GrantRequest{}, ok: created(&apiwire.GrantView{})},
		{pattern: "GET /v1/grants", summary: "List the live grants (all: the revoked too)", list: true,
			params: []apiParam{limitParam, afterParam, boolParam("all", "the revoked grants too")},
			ok:     ok(&[]apiwire.GrantView{})},
		{pattern: "DELETE /v1/grants/{id}", summary: "Revoke a grant (again: 200)", role: RoleAdmin,
			ok: ok(&apiwire.GrantView{}), errs: []int{404}},
		{pattern: "GET /v1/instances", summary: "List the live instances sharing the database (limit and after are checked, but the list is answered whole)",
			params: []apiParam{limitParam, afterParam, boolParam("all", "the dead instances too")},
			ok:     ok(&[]apiwire.InstanceView{})},
		{pattern: "POST /v1/rollouts", summary: "Create a rollout (201 new, 200 the same content again)", role: RoleOperator,
			body: &apiwire.RolloutRequest{}, ok: created(ro), errs: []int{403, 409, 422}},
		{pattern: "GET /v1/rollouts", summary: "List rollouts by id", list: true,
			params: []apiParam{limitParam, afterParam, statusParam("only the rollouts in this state", states(fsm.Rollout))},
			ok:     ok(&[]apiwire.RolloutView{})},
		{pattern: "GET /v1/rollouts/{id}", summary: "Read a rollout with its counts, rate and history", ok: ok(ro), errs: []int{404}},
		{pattern: "GET /v1/rollouts/{id}/devices", summary: "List a rollout's devices by id", list: true,
			params: []apiParam{limitParam, afterParam, statusParam("only the devices in this state", states(fsm.RolloutDevice))},
			ok:     ok(&[]apiwire.RolloutDeviceView{}), errs: []int{404}},
		{pattern: "POST /v1/rollouts/{id}/pause", summary: "Pause a rollout", role: RoleOperator,
			body: &emptyBody{}, optionalBody: true, ok: ok(ro), errs: []int{404, 409}},
		{pattern: "POST /v1/rollouts/{id}/resume", summary: "Resume a rollout", role: RoleOperator,
			body: &emptyBody{}, optionalBody: true, ok: ok(ro), errs: []int{404, 409}},
		{pattern: "POST /v1/rollouts/{id}/cancel", summary: "Cancel a rollout", role: RoleOperator,
			body: &emptyBody{}, optionalBody: true, ok: ok(ro), errs: []int{404, 409}},
		{pattern: "POST /v1/rollouts/{id}/approvals", summary: "Approve a rollout's version", role: RoleApprover,
			body: &apiwire.RolloutApprovalRequest{}, ok: created(ro), errs: []int{404, 409}},

		// The operators' view.
		{pattern: "GET /v1/operations", summary: "List operations newest first (by start, then id)", list: true,
			params: []apiParam{opsLimitParam, opsAfterParam, repeatedStatus("only the operations in these states", states(fsm.Operation)),
				textParam("device", "only the operations on this device"), textParam("action", "only this action"),
				textParam("task_id", "only the steps of this task"), textParam("submitted_by", "only those this principal submitted"),
				timeParam("since", "started at or after (RFC 3339)"), timeParam("until", "started before (RFC 3339)")},
			ok: ok(&[]apiwire.Operation{})},
		{pattern: "GET /v1/commands", summary: "List commands newest first (by start, then id)", list: true,
			params: []apiParam{opsLimitParam, opsAfterParam, repeatedStatus("only the commands in these states", states(fsm.Command)),
				textParam("device", "only the commands to this device"), textParam("action", "only this action"),
				textParam("operation_id", "only the commands of this operation"),
				timeParam("since", "issued at or after (RFC 3339)"), timeParam("until", "issued before (RFC 3339)")},
			ok: ok(&[]apiwire.Command{})},
		{pattern: "GET /v1/audit", summary: "List the changes people caused, newest first", list: true,
			params: []apiParam{opsLimitParam, opsAfterParam, textParam("principal", "only this principal's changes"),
				timeParam("since", "at or after (RFC 3339)"), timeParam("until", "before (RFC 3339)")},
			ok: ok(&[]apiwire.AuditEntry{})},

		{pattern: "GET /v1/events", summary: "The server-sent event stream of this instance's changes (each data line is an EventData)",
			queryToken: true, params: []apiParam{
				{name: "last_event_id", in: "query", doc: "resume after this event id (as Last-Event-ID)", schema: map[string]any{"type": "string"}},
				{name: "Last-Event-ID", in: "header", doc: "resume after this event id", schema: map[string]any{"type": "string"}}},
			ok: ok(nil), okMedia: "text/event-stream", errs: []int{404}},
		{pattern: "GET /v1/whoami", summary: "Who the token is", ok: ok(&apiwire.Who{})},
		{pattern: "GET /v1/openapi.json", summary: "This document", role: "-", ok: ok(&map[string]any{})},
		{pattern: "GET /healthz", summary: "Liveness: 503 once the store failed for good", role: "-",
			ok: map[int]any{http.StatusOK: &health{}, http.StatusServiceUnavailable: &health{}}},
		{pattern: "GET /metrics", summary: "Prometheus metrics", role: "-", ok: ok(nil), okMedia: "text/plain"},
		{pattern: "GET /ui/", summary: "The dashboard (the page asks for a token); its files are under /ui/", role: "-", ok: ok(nil), okMedia: "text/html"},
		{pattern: "GET /{$}", summary: "Redirects to /ui/", role: "-", ok: map[int]any{http.StatusFound: nil}},
		{pattern: "POST /mcp", summary: "The MCP tools over streamable HTTP (stateless, JSON answers): a JSON-RPC message of the Model Context Protocol",
			body: &map[string]any{}, ok: map[int]any{http.StatusOK: &map[string]any{}, http.StatusAccepted: nil}, errs: []int{404}},
	}
}

// transportCodes are the error codes the API itself answers (beside the
// domain's, codeStatus), with their status.
var transportCodes = map[string]int{
	"invalid_json": 400, "invalid_request": 400, "invalid_wait": 400, "invalid_plan": 400,
	"unauthorized": 401, "forbidden": 403, "forbidden_origin": 403, "not_found": 404,
	"method_not_allowed": 405, "illegal_state": 409, "too_large": 413, "unsupported_media_type": 415,
	"misdirected_request": 421, "idempotency_key_reused": 422, "unavailable": 503,
}

// errorCodes lists the codes answered with each status.
func errorCodes() map[int][]string {
	out := map[int][]string{}
	add := func(code string, status int) {
		if !slices.Contains(out[status], code) {
			out[status] = append(out[status], code)
		}
	}
	for code, status := range codeStatus {
		add(string(code), status)
	}
	for code, status := range transportCodes {
		add(code, status)
	}
	for _, codes := range out {
		sort.Strings(codes)
	}
	return out
}

func buildOpenAPI(tokens bool) map[string]any {
	g := &schemaGen{defs: map[string]any{}}
	codes := errorCodes()
	var all []string
	for _, cs := range codes {
		all = append(all, cs...)
	}
	sort.Strings(all)
	g.defs["Error"] = map[string]any{"type": "object", "additionalProperties": false, "required": []string{"error", "message"},
		"description": "Every error body: a stable code and a message for a person.",
		"properties":  map[string]any{"error": map[string]any{"type": "string", "enum": all}, "message": map[string]any{"type": "string"}}}
	g.ref(reflect.TypeFor[apiwire.EventData](), false) // each data line of GET /v1/events

	responses := map[string]any{}
	for status, cs := range codes {
		desc := http.StatusText(status) + ": " + strings.Join(cs, ", ")
		r := map[string]any{"description": desc, "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{
			"allOf": []any{refTo("Error"), map[string]any{"properties": map[string]any{"error": map[string]any{"enum": cs}}}}}}}}
		switch status {
		case http.StatusServiceUnavailable:
			r["headers"] = map[string]any{"Retry-After": map[string]any{"required": true, "description": "seconds; retry with the same ids",
				"schema": map[string]any{"type": "string", "pattern": "^[0-9]+$"}}}
		case http.StatusMethodNotAllowed:
			r["headers"] = map[string]any{"Allow": map[string]any{"required": true, "schema": map[string]any{"type": "string"}}}
		}
		responses[strconv.Itoa(status)] = r
	}

	paths := map[string]any{}
	for _, rt := range apiRoutes() {
		method, path, _ := strings.Cut(rt.pattern, " ")
		path = strings.TrimSuffix(path, "{$}")
		item, _ := paths[path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[path] = item
		}
		item[strings.ToLower(method)] = g.operation(rt, path, tokens)
	}
	desc := "The controller's HTTP API (docs/api.md). Every GET route also answers HEAD. A method a path does not serve " +
		"answers 405 method_not_allowed with Allow; a path no route has, 404 not_found."
	security := []any{map[string]any{"bearer": []string{}}}
	if !tokens {
		desc += " This controller runs without --tokens: no route needs a token (the bearer scheme is what one with --tokens asks for)."
		security = []any{}
	}
	return map[string]any{
		"openapi":  "3.1.0",
		"info":     map[string]any{"title": "fleetctl controller API", "version": "1", "description": desc},
		"security": security,
		"paths":    paths,
		"components": map[string]any{
			"schemas":   g.defs,
			"responses": responses,
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer",
				"description": "controller serve --tokens FILE: any valid token may read (GET); changes need the role each route names " +
					"(admin holds every role). Without --tokens no token is needed and every caller is anonymous with every role."},
				"access_token": map[string]any{"type": "apiKey", "in": "query", "name": "access_token",
					"description": "the bearer token as ?access_token=, taken by GET /v1/events alone (a browser's EventSource cannot send headers)"}},
		},
	}
}

func refTo(name string) map[string]any { return map[string]any{"$ref": "#/components/schemas/" + name} }

// operation is one route's Operation Object.
func (g *schemaGen) operation(rt apiRoute, path string, tokens bool) map[string]any {
	o := map[string]any{"summary": rt.summary, "operationId": openapiOperationID(rt.pattern)}
	var params []any
	if strings.Contains(path, "{id}") {
		params = append(params, map[string]any{"name": "id", "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
	}
	for _, p := range rt.params {
		pm := map[string]any{"name": p.name, "in": p.in, "description": p.doc, "schema": p.schema}
		if p.required {
			pm["required"] = true
		}
		if p.schema["type"] == "array" {
			pm["style"], pm["explode"] = "form", true
		}
		params = append(params, pm)
	}
	if params != nil {
		o["parameters"] = params
	}
	if rt.body != nil {
		o["requestBody"] = map[string]any{"required": !rt.optionalBody,
			"content": map[string]any{"application/json": map[string]any{"schema": g.ref(reflect.TypeOf(rt.body).Elem(), true)}}}
	}
	resp := map[string]any{}
	for status, body := range rt.ok {
		r := map[string]any{"description": http.StatusText(status)}
		switch {
		case body != nil:
			r["content"] = map[string]any{"application/json": map[string]any{"schema": g.ref(reflect.TypeOf(body).Elem(), false)}}
		case rt.okMedia != "":
			r["content"] = map[string]any{rt.okMedia: map[string]any{"schema": map[string]any{"type": "string"}}}
		}
		if status == http.StatusFound {
			r["headers"] = map[string]any{"Location": map[string]any{"required": true, "schema": map[string]any{"type": "string"}}}
		}
		if rt.list {
			r["headers"] = map[string]any{
				"X-Total-Count": map[string]any{"required": true, "description": "the number of items matching the filter",
					"schema": map[string]any{"type": "integer", "minimum": 0}},
				"Link": map[string]any{"description": `the next page, <...>; rel="next"; absent on the last one`,
					"schema": map[string]any{"type": "string", "pattern": `^<[^>]+>; rel="next"$`}}}
		}
		resp[strconv.Itoa(status)] = r
	}
	// The refusals of every route: the browser rules and the body limit,
	// before routing; then, under /v1, the query and id checks, auth and
	// the store.
	errs := slices.Clone(rt.errs)
	errs = append(errs, http.StatusForbidden, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType)
	if path != "/healthz" && path != "/metrics" {
		errs = append(errs, http.StatusMisdirectedRequest)
	}
	if rt.role != "-" && tokens {
		errs = append(errs, http.StatusUnauthorized)
	}
	if strings.HasPrefix(path, "/v1/") {
		errs = append(errs, http.StatusBadRequest, http.StatusServiceUnavailable)
	}
	if rt.body != nil {
		errs = append(errs, http.StatusBadRequest)
	}
	for _, st := range errs {
		if _, ok := resp[strconv.Itoa(st)]; !ok {
			resp[strconv.Itoa(st)] = map[string]any{"$ref": "#/components/responses/" + strconv.Itoa(st)}
		}
	}
	o["responses"] = resp
	switch {
	case !tokens:
	case rt.role == "-":
		o["security"] = []any{}
	case rt.queryToken:
		o["security"] = []any{map[string]any{"bearer": []string{}}, map[string]any{"access_token": []string{}}}
	}
	switch rt.role {
	case "-", "":
	default:
		o["x-role"] = rt.role
		o["description"] = "Needs the " + rt.role + " role (admin holds every role)."
	}
	return o
}

// openapiOperationID derives a stable operationId from a pattern: "GET
// /v1/tasks/{id}/plan" is "get_tasks_id_plan".
func openapiOperationID(pattern string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.Replace(pattern, "/v1/", "/", 1)) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "_"):
			b.WriteByte('_')
		}
	}
	return strings.TrimRight(b.String(), "_")
}

// schemaGen reflects Go types into JSON Schemas (2020-12), as
// encoding/json encodes them. Named structs become components; a request
// body's nested types get their own components (named ...Input) when
// their required fields differ from the answers'.
type schemaGen struct{ defs map[string]any }

// requestRequired are the fields a request must carry: the server refuses
// the request without them (400; a version, 409 stale_version), as
// TestOpenAPIRequiredFieldsAreRequired checks. In answers every field
// without omitempty is present; in requests absence is a value, so it is
// said here.
var requestRequired = map[string][]string{
	"SubmitRequest": {"target", "action"}, "CompensationRequest": {"action", "business_version"},
	"TaskRequest": {"task_id", "steps"}, "Step": {"step", "action", "target"}, "PlanRequest": {"steps"},
	"ApprovalRequest": {"version"}, "GrantRequest": {"principal", "action", "devices"},
	"ResolveRequest": {"outcome"}, "RolloutRequest": {"rollout_id", "action", "devices"},
	"RolloutApprovalRequest": {"version"},
	"Ramp":                   {"base_per_minute", "factor", "every_succeeded"}, "AbortRule": {"when", "percent"},
	"MaintenanceWindow": {"cron", "duration"},
}

// fieldSchemas replace the reflected schema of a field ("Type.field"):
// what the Go type cannot say.
func fieldSchemas() map[string]map[string]any {
	enum := func(v []string) map[string]any { return map[string]any{"type": "string", "enum": v} }
	params := map[string]any{"type": []string{"object", "null"}, "description": "an object; absent or null means {}"}
	devices := map[string]any{"description": "a shell glob (device-*) or a list of device ids",
		"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}}
	return map[string]map[string]any{
		"Operation.status": enum(states(fsm.Operation)), "Command.status": enum(states(fsm.Command)),
		"TaskView.status": enum(states(fsm.Task)), "TaskListItem.status": enum(states(fsm.Task)),
		"RolloutView.status": enum(states(fsm.Rollout)), "RolloutDeviceView.status": enum(states(fsm.RolloutDevice)),
		"ResolveRequest.outcome": enum([]string{"succeeded", "failed"}),
		"EventData.kind":         enum([]string{"command", "operation", "device", "task", "rollout", "reset"}),
		"SubmitRequest.params":   params, "CompensationRequest.params": params, "Step.params": params, "RolloutRequest.params": params,
		"Operation.params": params, "Command.params": params, "RolloutView.params": params,
		"RolloutRequest.devices": devices, "RolloutView.devices": devices,
		"AuditEntry.detail": {"type": "object", "description": "what changed (a resolve's outcome and note)"},
	}
}

var (
	timeType = reflect.TypeFor[time.Time]()
	rawType  = reflect.TypeFor[json.RawMessage]()
)

// componentName is a named type's component: its Go name, with Input for
// a request's nested types that answers use too.
func componentName(t reflect.Type, request bool) string {
	name := t.Name()
	if request && requestRequired[name] != nil && !strings.HasSuffix(name, "Request") {
		name += "Input"
	}
	switch name { // the unexported ones
	case "emptyBody":
		return "Empty"
	case "health":
		return "Health"
	}
	return name
}

// ref is the schema of t: a $ref for a named struct, inline otherwise.
func (g *schemaGen) ref(t reflect.Type, request bool) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == rawType:
		return map[string]any{"description": "any JSON value"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return orNull(g.ref(t.Elem(), request))
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int32:
		return map[string]any{"type": "integer"}
	case reflect.Int64:
		return map[string]any{"type": "integer", "format": "int64"}
	case reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": g.ref(t.Elem(), request)}
	case reflect.Map:
		if t.Elem().Kind() == reflect.Interface {
			return map[string]any{"type": "object"}
		}
		return map[string]any{"type": "object", "additionalProperties": g.ref(t.Elem(), request)}
	case reflect.Struct:
		name := componentName(t, request)
		if _, ok := g.defs[name]; !ok {
			g.defs[name] = nil // a cycle finds it here
			g.defs[name] = g.object(t, request)
		}
		return refTo(name)
	}
	panic("openapi: no schema rule for " + t.String())
}

// orNull lets a schema be null too (a nil pointer, slice or map).
func orNull(s map[string]any) map[string]any {
	if typ, ok := s["type"].(string); ok {
		c := map[string]any{}
		for k, v := range s {
			c[k] = v
		}
		c["type"] = []string{typ, "null"}
		return c
	}
	return map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
}

// object is a struct's schema: its fields as encoding/json names them,
// embedded structs' fields promoted, unknown members refused.
func (g *schemaGen) object(t reflect.Type, request bool) map[string]any {
	props := map[string]any{}
	depth := map[string]int{} // encoding/json: the shallowest field of a name wins
	var required []string
	overrides := fieldSchemas()
	var walk func(t reflect.Type, d int)
	walk = func(t reflect.Type, d int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				walk(f.Type, d+1) // promoted
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if od, seen := depth[name]; seen && od <= d {
				continue
			}
			depth[name] = d
			omit := strings.Contains(","+opts+",", ",omitempty,") || strings.Contains(","+opts+",", ",omitzero,")
			s, ok := overrides[t.Name()+"."+name]
			if !ok {
				s = g.ref(f.Type, request)
				if !omit && (f.Type.Kind() == reflect.Slice && f.Type != rawType || f.Type.Kind() == reflect.Map) {
					s = orNull(s) // a nil slice or map is null
				}
			}
			props[name] = s
			if !request && !omit && !slices.Contains(required, name) {
				required = append(required, name)
			}
		}
	}
	walk(t, 0)
	if request {
		required = requestRequired[t.Name()]
	}
	out := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		out["required"] = required
	}
	return out
}
