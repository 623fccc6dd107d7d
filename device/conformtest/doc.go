// Package conformtest checks a running device against the rules of the
// fleetctl device protocol (docs/protocol.md), acting as a controller on the
// broker and judging the device only from what crosses the broker: its
// receipts and its presence. The device may be written in any language;
// `devicesim conform` is this package on the command line, and a device
// written in Go runs the same suite in its own tests:
//
//	func TestConforms(t *testing.T) {
//		// start the device under test, then:
//		conformtest.Run(t, conformtest.Options{
//			MQTT:    "tcp://127.0.0.1:1883",
//			Device:  "device-1",
//			Restart: restartMyDevice, // kill it abruptly, start it again
//		})
//	}
//
// Check returns one Result per rule, in the order of Rules, which is the
// contract's table:
//
//	presence-birth              a retained birth with online, session, capabilities
//	receipts-ordered            a command's receipts carry its ids, seq from 1 up, a final status last
//	dedupe-command-id           the same command again (attempt 2) gets its latest receipt, unchanged
//	dedupe-operation-id         a new command_id of an operation that ran gets that command's latest receipt
//	dedupe-before-expiry        a repeat after expires_at gets the latest receipt, not rejected/expired
//	expired-rejected            a never-seen expired command gets rejected, error expired, and does not run
//	query-known                 a Query for a command that ran gets its current status and the query_id
//	query-by-operation          a Query for an unseen command_id of an operation that ran gets the one that ran
//	query-unknown               a Query for a command never seen gets unknown, seq 0, the query_id
//	malformed-ignored           malformed commands and queries change nothing; the next command is answered
//	presence-session-increases  after Restart, the new birth's session is larger than any before
//	dedupe-survives-restart     after Restart, repeats of commands that ran are still not executed
//
// # How it judges
//
// Every run mints its own ids (c-conform-<run>-<letter>, op-conform-<run>-<letter>,
// q-conform-<run>-<letter>), so runs never meet each other's records. The
// answer to a repeat must be the latest receipt of the command that ran,
// unchanged: the same command_id, status, seq, result (compared as JSON
// values) and error. A new received or executing receipt for a command that
// had ended, a larger seq, or another result shows that it ran again. The
// default action is "restart", whose result in devicesim carries a boot
// counter, so a second run changes its result; pick another action with
// Action and Params (one the device runs and succeeds or fails, not one it
// rejects: the dedupe rules need a command that ran).
//
// The device's latest receipt for a command is the last one it sent for it
// (answers to queries aside): once a rule has caught a second run, the
// following rules judge against what the device said last, so that one
// flaw fails the rule that exposes it and not every rule after it.
//
// After the answer to a repeat, the suite keeps watching for a settling
// time (a tenth of Timeout, from 100ms to 2s) before it judges: a device
// that answers correctly and then runs the command again is caught only if
// its receipts come within that time.
//
// # Decisions where the contract is silent
//
//   - A device that declares dedupe:false gets the dedupe rules as SKIP
//     (dedupe-command-id, dedupe-operation-id, dedupe-before-expiry,
//     dedupe-survives-restart) and also query-by-operation: a device without
//     the dedupe record has no operation to look up. A device that declares
//     query:false gets the query rules (query-known, query-by-operation,
//     query-unknown) as SKIP. A conforming device declares both true; the
//     SKIP lines say why. Without a birth the suite assumes both true.
//   - dedupe-before-expiry runs a command whose expires_at is half of
//     Timeout (at least 1s) after it is sent, sent right after the birth is
//     seen so that its expiry passes while the next rules run; the repeat
//     goes out one second after expires_at by the suite's clock. A device
//     whose clock is ahead of the suite's by more than that window rejects
//     the first copy as expired, and the rule fails saying so.
//   - expired-rejected accepts a received receipt before the rejection
//     (the protocol allows the check when the command's turn comes); any
//     executing, succeeded or failed receipt fails it.
//   - malformed-ignored sends, on both the commands and the queries topic:
//     text that is not JSON, truncated JSON, an empty payload, null, an
//     array, an object whose ids have the wrong types, and bytes that are
//     not UTF-8. It fails if the device's presence changes meanwhile (a
//     crash shows as its last will or a new birth), if the next command gets
//     no final receipt, or if an earlier command gets new received or
//     executing receipts. Receipts that answer the garbage are not judged.
//   - dedupe-survives-restart repeats, after the restart, the command of
//     receipts-ordered and the one of malformed-ignored (the last to run
//     before the restart, so the freshest record), and sends a new
//     command_id for the latter's operation.
//   - Result's JSON (`devicesim conform --json`, one object a line) is
//     {"rule", "outcome" (PASS, FAIL or SKIP, as in the lines), "detail"};
//     no summary object follows.
//   - Restart is a function; ShellRestart makes one from a shell command
//     (`devicesim conform --restart`). It must return once the device is
//     starting again (start it in the background); the suite then waits up
//     to Timeout for a birth it has not seen before.
//   - The suite connects with a clean session, client id
//     controller-conform-<run> (under the secure profile the broker uses
//     the account's user name instead: give the suite an account of its
//     own, `devicesim creds --controllers conform`, or it takes over the
//     session of a controller using the same account). Commands go out at
//     QoS 1, or QoS 0 to a device that declared dedupe:false, as the
//     controller does.
//
// The package links no controller code and no database driver: only the
// wire types (internal/wire, a leaf) and the MQTT client.
package conformtest
