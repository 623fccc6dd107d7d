// Package sim simulates a fleet of devices that speak the controller's MQTT
// protocol (package wire, docs/protocol.md), with fault injection. It runs
// as the devicesim binary (cmd/devicesim) and in-process, in the
// controller's tests, against a real broker.
//
// # Use
//
//	fleet, err := sim.Start(ctx, sim.Config{
//		MQTT: broker.URL(), Devices: 3, StateDir: t.TempDir(),
//		Faults: sim.Profile{Defaults: sim.Faults{DropReceipt: sim.ReceiptFault{
//			Trigger: sim.Trigger{P: 0.2}, Statuses: []string{sim.ClassFinal}}}},
//	})
//	defer fleet.Stop()
//	err = fleet.WaitOnline(ctx)
//	d := fleet.Device("device-3")
//	d.DropConnection(2 * time.Second) // abrupt: the broker fires the LWT; back with a new session
//	d.CrashFor(time.Second)           // kill -9 and boot again; durable state survives
//	_ = d.Restart()                   // crash-and-restart now
//	_ = d.SetFaults(sim.Faults{Legacy: sim.Legacy{Enabled: true}})
//	stats := d.Stats()
//	execs, _ := witness.ReadExecutions(fleet.StateDir())
//
// Devices are numbered from 1 (IDPrefix "device-", Devices 3: device-1 to
// device-3), or named by Config.IDs. Each has one MQTT connection whose client
// id and user name are its id. Fleet.Stop shuts every device down cleanly;
// cancelling Start's context does the same.
//
// # A conforming device
//
// Every simulated device is a device.Device of the public device library
// (package github.com/fleetctl/fleetctl/device), which keeps every rule of
// the protocol: the durable record by command_id and operation_id, dedupe
// before expiry, receipts with seq, queries answered from the record, the
// growing session with birth, LWT and clean offline presence, redelivery
// after a crash, and the resolution at boot of an action a crash
// interrupted. The simulator adds the actions, the witness files and the
// faults, all through the library's seams (device.Hooks, Device.Kill,
// Device.DropConnection, Device.SetCapabilities, Options.Clock, Accept and
// Resolve); it has no implementation of the rules of its own. Without
// faults, a device does what the contract's "A conforming device" asks
// (see the library's documentation for the details):
//
//   - Dedupe. A repeated command_id never runs again; a command whose
//     operation_id another command took never runs; both are answered with
//     the latest receipt of that record. This check comes before the
//     expiry check. An operation_id is taken when a command is accepted
//     ("received"); it is given back if that command ends without running
//     (rejected as expired when its turn came, or interrupted before it
//     started). Records are kept until Retention (default 24h) past
//     expires_at.
//   - Expiry. A command whose expires_at has passed by the device's clock
//     (skew included) is answered rejected, error "expired", seq 1; it is
//     checked again when the command's turn to execute comes.
//   - Queries. A query is answered with the latest receipt for its
//     command_id, else for the command that took its operation_id, else
//     status "unknown" with seq 0; always with its query_id.
//   - Presence. Before every connection attempt the session number is
//     raised and saved; the attempt carries a retained LWT; once connected
//     the device subscribes and then publishes a retained birth; a clean
//     stop publishes a retained offline presence and then DISCONNECTs.
//   - Receipts. received (seq 1), executing (2), then succeeded with a result
//     or failed with an error (3), QoS 1, not retained, on {root}/{d}/receipts.
//     A command refused before it is accepted gets one receipt, rejected
//     (seq 1): "expired", "unsupported_action", "invalid_params" (params
//     that are no JSON object, for any action), or the reject fault's
//     error.
//   - Actions: "restart" (bumps the durable boot counter; result
//     {"restarted":true,"boots":N}; the connection stays up) and "set-config"
//     (params, an object, merged into the durable config as a JSON merge
//     patch, a null removing a key; result {"config_keys","config_sha256",
//     "changed_keys"}, with "config" while it encodes to at most 4 KiB).
//     The boot counter and the config are the application's state, kept in
//     the library's record (Hooks.SaveApp, LoadApp). Anything else is
//     rejected "unsupported_action".
//
// A device handles its commands and queries one at a time in arrival order
// and executes accepted commands one at a time, so a query or a repeat is
// answered while an action runs.
//
// # Durable state and crash rules
//
// The fleet shares one device.Journal (<StateDir>/devices: one snapshot
// <id>.json per device and the fleet's journal <pid>-<nanos>.journal, a
// group commit: many devices' changes and witness lines become durable with
// one fsync per file). A journal left by a process killed with kill -9 is
// folded at the next start; if its lock is still held (the process is still
// exiting) the start waits for it up to 5s, and fails rather than skip its
// records. Each device runs as a sequence of incarnations: each boot (Start,
// Restart, the restart after a crash) is a new device.Device on the journal,
// booting from what is durable; a crash (Crash, CrashFor, Restart, the crash
// fault) is device.Device.Kill: the TCP connection is reset (no DISCONNECT:
// the broker publishes the LWT), the incarnation's memory (queued work,
// receipts the delay and reorder faults hold) is lost, and the batches it
// left finish before the next incarnation boots.
//
// An execution is witnessed by its line in executions.jsonl, written in the
// same journal batch as the save of the device's record that first holds
// the execution's effect and outcome (Hooks.SaveLine): no record outlives
// its line. At boot a command found "executing" is resolved without running
// it again (Options.Resolve): if the application state holds its outcome,
// or executions.jsonl holds a line of it, it ran (its effect is applied if
// it was not saved); otherwise it never ran and it is failed with error
// "interrupted" (its operation_id given back). The fail fault's decision is
// taken when the command is accepted and saved with its record, so a
// resolved execution keeps it. A device that cannot make its record durable
// (a failed write or fsync) dies and boots again a second later from what
// is durable; nothing of the failed change is announced.
//
// A clean stop lets the executor finish its command, except that an action
// slowed by slow_execution is cut short and answered failed "interrupted"
// (it did not run); commands still waiting stay "received" for the next boot.
// Receipts held by the delay or reorder faults are published at once, and the
// stop waits (up to PublishTimeout) for the broker's acknowledgements.
//
// # Witness files
//
// <StateDir>/executions.jsonl gets one line per real execution:
// {"device_id","command_id","operation_id","action","at"}. A fail-fault
// failure is a real execution (the action ran and failed); a rejection, an
// expiry and an interrupted command are not. <StateDir>/receipts.jsonl gets
// one line per final receipt (succeeded, failed, rejected) that the broker
// acknowledged, one per publish (a duplicate, a repeat's answer and a query's
// answer each add one): {"device_id","command_id","operation_id","status",
// "seq","at","error","query_id"}. A receipt counts as published only when its
// PUBACK came back on the connection it was sent on; one caught by a
// connection loss is published again after the reconnect (paho completes the
// tokens of messages it resends from its store before any PUBACK, so those
// are not trusted). So every receipts.jsonl line is a receipt the broker
// took; a receipt the broker took whose PUBACK was lost to a crash may be
// missing, and so may a receipts.jsonl line not yet written when the
// process was killed (the line follows the PUBACK; nothing waits for it).
// "at" is by the device's clock, skew included, and equals the receipt's own
// at. The journal's writer appends each batch's lines in one write per file
// (opened O_APPEND) and fsyncs each file once, so devices sharing a state
// dir never interleave. A state dir serves one devicesim process at a time
// (fleets of one process may share it; a fleet starting folds the journals
// other processes left, and fails if one stays locked); one device id must
// not run in two fleets at once. Package witness holds the record types and
// the readers (witness.ReadExecutions and witness.ReadReceipts; a torn last
// line is ignored).
//
// # Fault profile
//
// A Profile has fleet-wide Defaults and per-device overrides (Devices); a
// device takes the Faults of the first Override whose Match (an exact id, or a glob with
// *, ? and [...] matched against the whole id) fits, else the defaults. In
// JSON (ParseProfile, LoadProfile, devicesim --faults FILE) an override lists
// only the keys it changes; each replaces that whole fault of the defaults:
//
//	{"seed": 7,
//	 "defaults": {"drop_receipt": {"p": 0.1, "statuses": ["final"]},
//	              "delay_receipt": {"p": 0.2, "delay": "1.5s"},
//	              "clock_skew": "-2s"},
//	 "devices": [
//	   {"match": "device-1?", "faults": {"crash": {"count": 1, "at": "executed", "for": "1s"}}},
//	   {"match": "device-3",  "faults": {"legacy": true}},
//	   {"match": "device-4",  "faults": {"legacy": {"dedupe": false, "query": true}}}]}
//
// Every fault but clock_skew and legacy has a trigger {"p": 0..1, "count": N,
// "skip": N}: of the fault's opportunities, the first skip never fire, then
// each fires with probability p, at most count times when count > 0; p 0 with
// a count means the next count opportunities. Counters are per device and
// start again when its faults change. Decisions draw from a random source per
// device seeded by the seed (Config.Seed, else the profile's, else 1) and the
// device id, so the same traffic makes the same decisions.
//
//	drop_command       an incoming command is lost before it is recorded (it
//	                   is acknowledged, so the broker does not redeliver it)
//	drop_receipt       a receipt is not published (it stays the latest: a
//	                   repeat or a query gets it)
//	duplicate_receipt  a receipt is published twice
//	delay_receipt      a receipt is published "delay" later (default 1s)
//	reorder_receipt    a receipt is held back and published right after the
//	                   device's next one (or after "delay", default 1s)
//	                   The four receipt faults take "statuses": received,
//	                   executing, succeeded, failed, rejected, unknown, "final"
//	                   (succeeded, failed, rejected), "query" (any answer to a
//	                   query); none means every receipt.
//	drop_connection    the TCP connection is reset without DISCONNECT (the
//	                   broker publishes the LWT); the device keeps working,
//	                   stays away "for" (default 0: reconnects at once), and
//	                   comes back with a new session; its receipts wait
//	crash              the device dies as above and boots again after "for"
//	                   Both take "at", a point of command handling (command,
//	                   received, executing, executed, final; see Point;
//	                   default command), or "every" DURATION: one opportunity
//	                   per tick, at any moment.
//	slow_execution     the action takes "delay"
//	fail               the action runs and fails with "error" (default
//	                   "simulated_failure"), with no effect on the state
//	reject             the command is rejected with "error" (default
//	                   "simulated_rejection") before it is accepted: it does
//	                   not run and does not take its operation_id
//	                   These three take "actions": the actions they apply to.
//	ignore_queries     a query goes unanswered
//	clock_skew         "DURATION" added to the device's clock: expiry checks
//	                   and every "at" it writes (receipts, births, witnesses)
//	legacy             true: capabilities dedupe:false, query:false; or
//	                   {"dedupe": bool, "query": bool}. Without dedupe the
//	                   device runs every delivery, repeats included (each a
//	                   witness line, its receipts continuing the seq: 4, 5,
//	                   6...), and has no operation claims; without query it
//	                   ignores queries. Expiry still holds. A legacy device's
//	                   crash recovery is best effort (its witness is exact).
//
// Changing a device's capabilities at run time (SetFaults) makes it
// reconnect, so that the new birth announces them.
//
// # MQTT client
//
// The library's: paho.mqtt.golang with a persistent session (CleanSession
// false), manual acks, KeepAlive (default 5s here), auto-reconnect with
// MaxReconnectInterval (default 1s). An offline window (DropConnection with
// a duration, the drop_connection fault's "for") holds every connection
// attempt in Hooks.Connect until it ends; a change of capabilities
// (SetFaults with legacy) is device.Device.SetCapabilities followed by a
// dropped connection, so the next birth announces it.
package sim
