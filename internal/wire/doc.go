// Package wire defines the MQTT wire protocol between the controller and
// devices: the topics, the JSON payloads and their validation. It is the
// single Go definition of the protocol that docs/protocol.md specifies; the
// controller and the device simulator both build on it, and device firmware
// written elsewhere is built against that page.
//
// Topics, under a configurable root (default "fleet"), {d} the device id:
//
//	{root}/{d}/commands   controller → device  QoS 1 (0 for dedupe:false devices)  Command
//	{root}/{d}/receipts   device → controller  QoS 1                              Receipt
//	{root}/{d}/queries    controller → device  QoS 1                              Query
//	{root}/{d}/presence   device / broker LWT  QoS 1, retained                    Presence
//
// A command's fields never change between re-sends of the same command_id
// (attempt aside). A receipt's seq counts the receipts a device sent for one
// command, from 1; an "unknown" answer to a query carries seq 0.
//
// Limits (check.go). The controller decodes receipts and presence with
// DecodeDevice: at most MaxDevicePayload (64 KiB), one JSON value nested at
// most MaxDepth (32) deep, no member name twice, numbers a double holds,
// fields of the right type; unknown fields are ignored. Receipt.Validate and
// Presence.Validate check the ids' charsets and lengths and the numbers'
// ranges. Each refusal is an *InputError carrying a Reason (the reason label
// of controller_inputs_refused_total) and the field it names. Commands a
// device accepts are bounded by MaxPayload (256 KiB, Decode).
package wire
