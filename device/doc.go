// Package device is a device of the fleetctl protocol (docs/protocol.md)
// that conforms by construction: a firmware or gateway author supplies a
// device id, a broker, a state directory and one Handler per action; the
// package keeps every rule of the protocol.
//
//	d, err := device.New(device.Options{
//		ID:           "pump-17",
//		Broker:       "ssl://broker.example.com:8883",
//		PasswordFile: "/etc/pump/mqtt-password",
//		CAFile:       "/etc/pump/ca.pem",
//		StateDir:     "/var/lib/pump",
//		Actions: map[string]device.Handler{
//			"restart": func(ctx context.Context, cmd *device.Command) (any, error) {
//				return map[string]any{"restarted": true}, nil
//			},
//		},
//	})
//	...
//	err = d.Run(ctx) // until ctx is done; then a clean offline presence
//
// # What the package does for you
//
//   - The durable record. Every command is recorded by command_id, and its
//     operation_id is marked taken, in StateDir, and made durable (fsync)
//     before anything announces it: the command is acknowledged to the
//     broker (PUBACK, with manual acks) and its "received" receipt
//     published only once its record is durable. A process killed before
//     that gets the command again from the broker (a persistent session,
//     clean session off).
//   - Dedupe, then expiry. A repeated command_id, or a new command of an
//     operation_id already taken, never runs: it is answered with the latest
//     receipt of the command that ran (its command_id, seq, result),
//     unchanged. This check comes before the expiry check, so a late repeat
//     gets its result; a new command past its expires_at (by Options.Clock)
//     is rejected "expired" and does not run. Expiry is checked again when
//     the command's turn to run comes.
//   - Receipts. received (seq 1), executing (2), then succeeded with the
//     handler's result or failed with its error (3); a handler's progress
//     (Command.Progress) adds executing receipts in between. A command
//     refused before it is accepted gets one receipt, rejected, seq 1:
//     "expired", "unsupported_action" (no handler), "invalid_params"
//     (params that are no JSON object) or Options.Accept's error. Each
//     receipt is durable as the command's latest before it is published,
//     QoS 1, and is published again after a reconnect if the broker did not
//     acknowledge it on the connection it was sent on.
//   - Queries are answered from the record: the latest receipt of the
//     command_id, else of the command that took the operation_id (carrying
//     that command_id), else "unknown" with seq 0; always with the query_id.
//   - Presence. Before each connection attempt the session number is raised
//     and made durable; the attempt carries the retained last will
//     {"online":false,"session":S}. Once connected the device subscribes to
//     its commands and queries and then publishes the retained birth
//     {"online":true,"session":S,"capabilities":{...},"at":...}. A clean stop
//     publishes the retained {"online":false,"session":S,"at":...} and then
//     DISCONNECTs.
//   - Crashes. At boot, a command found "executing" (its handler was running
//     when the process died) is never run again: Options.Resolve may say
//     whether the action ran and with what outcome; without it the command
//     is failed "interrupted". A command found "received" runs now (its
//     expiry checked first). The outcomes are recorded before the device
//     connects and published once it is online.
//   - Limits. A result over the protocol's 32 KiB is replaced by the
//     protocol's {"result_too_large":{"bytes":N,"limit":32768}} marker (the
//     status stands: the action's outcome is what matters), an error text is
//     cut at 1 KiB, a result that is no JSON object fails the command with
//     error "invalid_result: ...". A receipt the device sends is therefore
//     never refused by the controller.
//   - Records are kept Options.Retention (default 24h) past the command's
//     expires_at, then forgotten.
//
// # Handlers
//
// A device runs one action at a time, in arrival order, in a goroutine of
// its own; its commands and queries are handled meanwhile (a repeat of the
// running command is answered "executing"). MQTT callbacks only hand
// messages over, so a slow handler blocks nothing but the actions queued
// behind it. A handler's context is cancelled when Run's context is done:
// the device waits for the handler, then stops. A handler's error fails the
// command with the error's text; an error wrapping ErrNotStarted says the
// action did not start (failed "interrupted", the operation free again).
//
// # Many devices in one process
//
// A gateway runs many Devices over one Journal (Options.Journal, opened
// with OpenJournal): the records of all of them become durable with one
// write and one fsync per batch (group commit), so the cost of a command
// does not grow with the number of devices (see BenchmarkDevices). A Device given no
// Journal opens its own in StateDir and closes it when Run returns.
//
// # Capabilities
//
// A conforming device declares dedupe and query (the default). Legacy
// hardware may declare less in Options.Capabilities: without dedupe, every
// delivery of a command runs (receipts continue the seq: 4, 5, 6...) and no
// operation is taken; without query, queries are ignored. Expiry holds
// either way.
//
// # Seams for simulators and tests
//
// devicesim's faults wrap this package rather than re-implement its rules.
// The seams are kept out of a firmware author's way:
//
//   - Options.Hooks (nil for firmware): Receipt decides what becomes of each
//     durable receipt (drop, duplicate, delay, reorder: it gets a send
//     function to call zero or more times, now or later); Published sees
//     each receipt the broker acknowledged (a witness file); Command may
//     drop a command before it is recorded; Repeat sees each command
//     answered from the record without running (a counter); Query may
//     leave a query unanswered; Point runs at each point of a command's
//     handling (PointCommand to PointFinal), where a crash or a connection
//     drop is injected; SaveApp and LoadApp keep the application's own
//     state in the durable record, saved with every change (an action's
//     effect is durable with its final receipt, a Resolver's with the
//     outcomes it decides at boot); Connect runs before each dial of the
//     broker and may hold the device offline (an outage); Online runs each
//     time the device is online.
//   - Device.Kill ends a device as kill -9 does (TCP reset, the broker's last
//     will, nothing more recorded or published); a new Device of the same
//     id on the same Journal boots from what was durable.
//     Device.DropConnection resets the connection; the device comes back at
//     once with a new session (unless Connect holds it back).
//     Device.SetCapabilities turns a running device into legacy hardware
//     (or back); its next birth announces it.
//   - Options.Clock skews the device's clock; Options.Accept and wrapping a
//     Handler give rejected, failing and slow actions.
//   - Hooks.SaveLine gives a save of a device's record a line of a side
//     file (an execution's witness) written in the same batch and durable
//     before it; Journal.AppendLine appends a line on its own (a published
//     receipt's witness) in the journal's group commit;
//     JournalOptions.SyncHook fails fsyncs.
//
// # Decisions where the protocol is silent
//
//   - A command interrupted by a crash with no Resolve keeps its operation
//     taken (the action may have run: at most once wins); one Resolve says
//     never started gives it back, as the protocol allows.
//   - A device that cannot make its record durable (a failed write or
//     fsync) stops as a crash does: Run returns an error wrapping
//     ErrNotDurable, and nothing of the failed change is announced.
//   - The MQTT user name defaults to the device id (the secure broker
//     profile's account); the keepalive defaults to 30s.
//
// # Files
//
// StateDir (or the Journal's directory) holds <id>.json, each device's
// snapshot, and <pid>-<nanos>.journal, the journal: one JSON line per
// change. When it passes 64 MiB the writer moves on to a new journal file
// and folds the old one into the snapshots (written atomically) in the
// background, without stalling commits; Close folds the last one. A
// journal is flocked while open; OpenJournal folds what a dead process's
// journals left, oldest first, each up to its first torn line; a journal
// another process still holds locked is waited for (JournalOptions.LockWait,
// default 5s: a process killed a moment ago may still be exiting), and
// OpenJournal fails if the lock stays held rather than skip records. One
// device id must not run in two processes at once, and one directory holds
// the journal of one process at a time (Journals of one process may share
// it).
package device
