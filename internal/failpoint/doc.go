// Package failpoint puts a running controller exactly inside one of its
// failure windows, on purpose, so that tests, scenarios and an operator's
// game day can check what the code does there (docs/design.md, "Failpoints").
//
// # Arming
//
// Points are armed once, at start, from the environment:
//
//	CONTROLLER_FAILPOINTS="before-publish=1*crash; after-publish=3*error; before-lease-renew=sleep(15s)"
//
// The value is a list of name=action items separated by ';'. Whitespace
// around items, names and actions is ignored, and so are empty items. A name
// must be one of the points the program defines (Known, for the
// controller), and may be armed once; an unknown name, an unknown action or a
// malformed item is an error naming the item, and the daemon refuses to start
// on it. For each armed point the daemon writes one line to stderr,
//
//	failpoint armed: before-publish=1*crash
//
// (WriteArmed writes exactly those lines.)
//
// # Actions
//
//   - sleep(<Go duration>), e.g. sleep(1.5s): the goroutine that reached the
//     point pauses; nothing else in the process waits for it. HitContext
//     ends the pause early when its context is done, and returns the
//     context's error wrapped with the point name.
//   - crash: the process exits at once with status 137 (128+SIGKILL, what a
//     shell reports for kill -9), by os.Exit(137) after one line
//     "failpoint crash: <name>" on stderr. Like kill -9 it runs no deferred
//     function, closes nothing in order, flushes no user-space buffer and
//     commits no open transaction; the kernel then closes the files and drops
//     any flock, as after kill -9. os.Exit is used rather than SIGKILL to
//     itself so that a parent sees a plain exit: exec.Cmd reports "exit
//     status 137" and ExitCode() is 137 (a SIGKILL would give "signal:
//     killed" and ExitCode() -1).
//   - error: the point returns an *Error (Unwrap gives ErrInjected, so
//     errors.Is(err, ErrInjected) holds), and the caller runs its ordinary
//     failure path, exactly as if its database or broker call had failed.
//
// A prefix N* (N ≥ 1) makes the action fire only the first N times the point
// is reached: 1*crash, 3*error, 2*sleep(1s). After N hits the point is inert.
// Exactly N goroutines fire, however many reach the point at once. Counts
// live in the process: a restarted daemon given the same variable arms its
// points afresh.
//
// # Cost
//
// A program with no variable set holds a nil *Set, which is valid and
// disarmed: Hit is inlined to one nil check and returns nil. With points
// armed, reaching a point that is not armed costs one map lookup.
//
// # Use
//
//	fps, err := failpoint.FromEnv(failpoint.Known)
//	if err != nil { return err } // refuse to start
//	fps.WriteArmed(os.Stderr)
//	fps.OnHit(func(name string) { failpointHits.WithLabelValues(name).Inc() })
//	...
//	if err := fps.HitContext(ctx, failpoint.SubmitBeforeCommit); err != nil {
//		return err // rollback and 503, as for a failed commit
//	}
package failpoint
