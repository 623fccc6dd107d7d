// Package apiwire defines the JSON bodies of the controller's HTTP API
// (/v1, see docs/api.md): every request
// the API decodes and every answer it encodes, with their field names,
// omitempty and field order, which fix the bytes on the wire.
//
// It is a leaf: it imports the standard library alone, so that what speaks
// the API from outside (internal/client, the CLI's client subcommands,
// internal/mcpserver) links no database driver and no controller code.
// internal/api converts the store's records to these types at its edge;
// internal/rollout builds its Spec on RolloutSpec, so that a rollout's
// rules have one JSON form, stored and sent.
//
// internal/wire is the MQTT protocol between the controller and devices;
// this package is the HTTP one between the controller and its callers.
package apiwire
