// Package feed is the controller's one post-commit feed: every wake-up the
// store computes reaches the services through it, by one route.
//
// # What goes in
//
// The store publishes a store.Fact (store.Config.Feed):
//
//   - after each commit, in commit order, on its writer's goroutine: every
//     committed change (FactChanged, one line of the events log), every
//     command made due (FactDue: a submit or a retry, with the new command
//     as inserted; a receipt that asks for a decision; the open commands of
//     a device whose presence changed), a device whose serial queue moved
//     (FactQueue: one of its serial commands ended), and a person's action
//     on a rollout (FactRollout, with the lease token when this instance
//     created it);
//   - as they arrive, on the goroutine that listens for them: other
//     instances' wake-ups (PostgreSQL NOTIFY), as remote facts (Remote set):
//     an operation that left started, a command made due, a device whose
//     serial queue moved, and FactReset when wake-ups may have been missed.
//
// # How it is routed
//
// A Feed calls its route inline, on the publisher's goroutine: no goroutine
// hop and no queue between a commit and the dispatcher's kick or a ?wait=
// caller's wake-up. The route and its consumers must therefore return at
// once and never block or write to the store (a non-blocking channel send,
// a waiter's signal); anything slower hands the fact to a goroutine of its
// own without blocking, and a fact it drops is found again by the sweeps'
// polling, as a dropped wake-up always was. Consumers.Route is the one
// place that says which fact goes to whom; controller.New hands it the
// services once they all exist:
//
//	store commit ─┐                       ┌─ FactChanged operation (left started) → api ?wait= callers
//	              ├─ Feed.Publish ─ Route ┼─ FactChanged (every machine)            → events.Bus (the stream)
//	NOTIFY listen ┘   (inline)            ├─ remote operation → ?wait= callers, remoteEvents (read back → stream)
//	                                      ├─ FactDue (new: as inserted / other)     → Dispatcher.Submitted / Kick
//	                                      ├─ FactQueue (a device's serial queue)    → Dispatcher.QueueMoved (reads its head)
//	                                      ├─ FactRollout (created here / a person)  → Scheduler.Adopt / Wake
//	                                      └─ FactReset                              → the stream's reset event
//
// The broker's (re)connects are not the store's facts: the controller's
// watch loop reads mqttx.Client.Connects and tells the dispatcher and the
// receipt probe.
//
// # What is not routed here (yet)
//
// The task runner polls its active tasks and kicks its steps' commands
// itself (task.Config.Kick); a task's changes are marked in Route where
// they will go once it takes wake-ups. A device's presence change makes its
// open commands due in a transaction of its own that the receipt ingestor
// runs right after it, on the same goroutine, before the device's next
// message (store.Wake, as before this feed); those commands reach the
// dispatcher as FactDue. Route never writes to the store.
//
// # Before the route is set
//
// The store opens, and commits (a restarted instance's reclaim), before
// the services that consume its facts exist. A Feed keeps the facts
// published before Route is called (up to MaxPending) and hands them to
// the route first, in order; beyond that it keeps none and the route gets
// one FactReset after them instead (the event stream tells its readers to
// read again; every other consumer polls anyway).
package feed
