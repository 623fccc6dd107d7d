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
// Without faults, a device does what the contract's "A conforming device"
// asks:
//
//   - Dedupe. It keeps a durable record of every command by command_id, and
//     of which command took each operation_id. A repeated command_id never
//     runs again; a command whose operation_id another command took never
//     runs; both are answered with the latest receipt of that record (the
//     command_id that ran, its seq). This check comes before the expiry
//     check, so the repeat of an executed command that has since expired
//     still gets its receipt. An operation_id is taken when a command is
//     accepted ("received"); it is given back if that command ends without
//     running (rejected as expired when its turn came, or interrupted), so a
//     new command of the operation may run then. Records are kept until
//     Retention (default 24h) past expires_at.
//   - Expiry. A command whose expires_at has passed by the device's clock
//     (skew included) is answered rejected, error "expired", seq 1; it is
//     checked again when the command's turn to execute comes.
//   - Queries. A query is answered with the latest receipt for its command_id,
//     else for the command that took its operation_id (carrying that
//     command_id), else status "unknown" with seq 0; always with its query_id.
//   - Presence. Before every connection attempt the session number is raised
//     and saved; the attempt carries a retained LWT {"online":false,
//     "session":S}; once connected the device subscribes to its commands and
//     queries (QoS 1) and then publishes a retained birth {"online":true,
//     "session":S,"capabilities":{...},"at":...} (subscribing first, so a
//     controller reacting to the birth finds it listening). A clean stop
//     publishes a retained {"online":false,"session":S,"at":...} and then
//     DISCONNECTs.
//   - Receipts. received (seq 1), executing (2), then succeeded with a result
//     or failed with an error (3), QoS 1, not retained, on {root}/{d}/receipts.
//     A command refused before it is accepted gets one receipt, rejected
//     (seq 1): "expired", "unsupported_action", "invalid_params", or the
//     reject fault's error.
//   - Actions: "restart" (bumps the durable boot counter; result
//     {"restarted":true,"boots":N}; the connection stays up) and "set-config"
//     (params, an object, merged into the durable config as a JSON merge
//     patch, a null removing a key; result {"config_keys","config_sha256",
//     "changed_keys"}, with "config" while it encodes to at most 4 KiB).
//     Every receipt keeps the protocol's result and error limits
//     (wire.BoundReceipt).
//     Anything else is rejected "unsupported_action".
//
// A device handles its commands and queries one at a time in arrival order
// (one worker) and executes accepted commands one at a time (one executor),
// so a query or a repeat is answered while an action runs. Each is a
// goroutine only while it has work: an idle device holds none of its own,
// only its paho client's. MQTT callbacks only hand messages over; they never
// block.
//
// # Durable state and crash rules
//
// Durability is a group commit shared by the whole fleet (one per Fleet):
// many devices' state changes and witness lines become durable with one
// fsync per file. A device hands each change to the fleet's journal, under
// its own lock (so its changes keep their order), and goes on; whoever acts
// on the change (acknowledges a command, publishes a receipt, connects with
// a new session number) first waits until the device's latest batch is
// durable. One writer goroutine takes everything gathered, appends the
// witness lines (one write per witness file) and fsyncs those files, then
// appends the state records to the journal (one write) and fsyncs it, then
// releases every waiter of the batch at once; batches commit one after
// another, in order. A state record thus never becomes durable before an
// execution line of its batch or an earlier one.
//
// The journal is <StateDir>/devices/<pid>-<nanos>.journal, flocked while the
// fleet runs: one JSON line per record, a device's counters and config with
// the command records and operation claims that changed (a delta), or its
// whole state after a boot's recovery. A device's durable state is its
// snapshot <StateDir>/devices/<id>.json with its journal records applied in
// order (the writer keeps each device's record offsets, so a boot reads only
// its own). The journal is folded into the snapshots (each rewritten whole
// and atomically: tmp file, fsync, rename; then one fsync of the directory)
// and emptied when it passes 64 MiB and at a clean stop, where the file is
// removed. At start, a journal left by a dead process (its lock is free) is
// folded the same way, from its first line up to the first torn or
// malformed one: what follows that belongs to a batch whose fsync never
// returned, so nobody acted on it. A device killed at any instant (Crash,
// kill -9 of devicesim) restarts from what was durable; an in-process crash
// first lets the batches it left finish, kill -9 loses the records not yet
// written. The steps of one command, each durable before it is announced:
//
//  1. received: the record (with the operation claim) is recorded, then,
//     once durable, the command is acknowledged to the broker (PUBACK;
//     manual acks) and the receipt published. A crash before that leaves
//     the message unacknowledged, and the broker redelivers it (persistent
//     session).
//  2. executing: recorded together with the planned outcome (the result, or
//     the fail fault's error, and the effect on the state), published once
//     durable.
//  3. the action runs: its line goes to executions.jsonl. That line is the
//     execution.
//  4. final: the effect (config, boots) and the final receipt are recorded,
//     in the same batch as the line or a later one, and published once both
//     are durable.
//
// A batch whose write or fsync fails releases its waiters with the error:
// nothing of it is announced, each device that waited crashes and boots
// again a second later from what is durable. A failed witness write or
// fsync drops the batch's state records (they are not written); a failed
// journal fsync leaves them in the file, not known durable, so a boot may
// find them (nothing was announced of them either way). Repeats and queries
// are answered, like every receipt, only once the device's latest batch is
// durable.
//
// At boot a command found "executing" is resolved without running it again:
// if executions.jsonl holds more lines for it than the state counted, it ran
// and its planned outcome is applied (usually succeeded); otherwise it never
// ran and it is failed with error "interrupted" (and its operation_id given
// back). The resolved final receipt is published once the device is online.
// A command found "received" is handed to the executor again (expiry checked
// first). A final receipt recorded but not yet published is not re-sent by
// itself; a repeat or a query gets it. A device that cannot make its state
// or an execution's witness line durable crashes and boots again a second
// later (a receipts.jsonl line is not waited for: a failed one is logged).
//
// A clean stop lets the executor finish its command, except that an action
// slowed by slow_execution is cut short and answered failed "interrupted"
// (it did not run); commands still waiting stay "received" for the next boot.
// Receipts held by the delay or reorder faults are published at once, and the
// stop waits (up to PublishTimeout) for the broker's acknowledgements.
//
// A crash in process (Crash, CrashFor, Restart, the crash fault) resets the
// TCP connection so nothing more is written on it (no DISCONNECT: the broker
// publishes the LWT), discards the incarnation's memory (inbox, queued jobs,
// receipts waiting for a connection, delayed receipts) and, for a restart,
// boots a new incarnation from the file with a new MQTT client.
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
// (opened O_APPEND) and fsyncs each file once, so devices and processes
// sharing a state dir never interleave; one device id must not run in two
// fleets at once (each fleet has its own journal; a fleet starting folds
// only journals whose lock is free). Package witness holds the record types,
// the appender and the readers (witness.ReadExecutions and
// witness.ReadReceipts; a torn last line is ignored).
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
// paho.mqtt.golang with a persistent session (CleanSession false: QoS 1
// commands sent while a device is away wait at the broker), manual acks,
// KeepAlive (default 5s; the broker fires the LWT of a silent device after
// 1.5 times it), auto-reconnect with MaxReconnectInterval (default 1s). The
// will carries the session number and a client's will is fixed when the
// client is made, so the first connection makes a new client per attempt and
// paho's reconnects set the new will in the reconnecting handler (which also
// holds a reconnect back while the device is meant to be offline). The TCP
// connection is opened by the simulator (a custom open-connection function)
// so that it can be reset abruptly; a reset reports its own error, since paho
// takes "use of closed network connection" for its own deliberate close.
package sim
