// Package mcpserver is the controller's agent interface: a Model Context
// Protocol tool server (the official Go SDK) whose tools call the HTTP API.
//
// # One source of truth
//
// Every tool is a call of the HTTP API through internal/client, never a
// second implementation of its rules: idempotency (201, 200, 422
// idempotency_key_reused), approval (403 approval_required), grants (403
// permission_denied), roles (403 forbidden), ?wait= and its cap, the I-JSON
// checks of params are the API's, and a tool only turns the API's answer
// into a typed result, or its error into a tool error. Two ways in:
//
//   - `controller mcp` (Serve) speaks MCP over stdio to an agent host and
//     calls a running daemon at --server with --token: the agent's
//     principal is that token's.
//   - `controller serve` mounts HTTPHandler at /mcp (streamable HTTP,
//     stateless, JSON answers) inside the API, behind the same bearer
//     tokens: a request without a valid one gets 401 before MCP sees it.
//     Each tool call then sends its API request in process, through the
//     API's own handler, with the Authorization of the HTTP request that
//     carried the call, so it runs as the caller's principal with the
//     caller's roles, checked by the route as for any other client.
//
// Forwarding to the API's handler rather than calling the domain service
// with the caller's principal keeps the role table, the body rules, the
// error mapping and ?wait= in one place (internal/api): a route added or a
// rule changed there is the MCP tool's at once.
//
// # Arguments as the agent sent them
//
// The SDK validates a call's arguments against the tool's input schema
// through a map[string]any, which turns every number into a float64 and
// keeps the last of duplicate keys. The API must see the params the agent
// wrote (a duplicate key or an integer past 2^53 is its 400
// invalid_request, and the command carries the params as sent), so the
// tools that take params (submit_operation, create_task, update_plan,
// create_rollout) send the call's raw arguments, not the decoded struct.
//
// # Results and errors
//
// A result carries the API's record as structured content (typed, with a
// JSON schema) and as text: a line that tells the agent what the record
// means and what to do next, then the record's JSON. An operation still
// started is in doubt (in_doubt, next): ask again with get_operation and
// the same id, never a new id. Every API error is a tool error (IsError)
// whose text starts with the HTTP status and the API's code and whose
// structured content is {"error":{"status","code","message","hint"}}.
//
// There is no tool that approves: approvals are a person's (API, CLI,
// dashboard).
package mcpserver
