package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/sim"
	"github.com/fleetctl/fleetctl/internal/testenv"
)

// deviceQueue reads GET /v1/devices/{id} with its commands in flight and queued.
func (b *bundle) deviceQueue(id string) apiwire.DeviceDetail {
	b.t.Helper()
	d, err := b.client.Device(b.ctx(), id)
	require.NoError(b.t, err)
	return d
}

// verifySerial runs the invariant checker (b.verify) and requires its
// tenth verdict to have judged n serial commands on devs devices, every one
// published, none overlapping or out of order in the events log, and every
// execution in the devices' log checked against the final receipt of the
// serial command before it, none skipped: each device ran them one at a
// time, in the order their submits committed.
func (b *bundle) verifySerial(n, devs int) {
	b.t.Helper()
	out := b.verify()
	i := strings.Index(out, "invariant 10 PASS: ")
	require.GreaterOrEqual(b.t, i, 0, out)
	line, _, _ := strings.Cut(out[i:], "\n")
	require.Contains(b.t, line, fmt.Sprintf(": %d serial commands on %d devices (", n, devs))
	require.Contains(b.t, line, fmt.Sprintf("), %d published, 0 overlaps, 0 out of order; witness: %d executions checked, 0 skipped", n, n))
}

// queueGaps are, on every device, the times from a serial command's end
// to the first publish of the next one, where the next one was already
// queued when the one ahead ended (from the events log): how promptly the
// end's wake-up publishes the next, sorted.
func (b *bundle) queueGaps() []time.Duration {
	b.t.Helper()
	type marks struct{ submitted, published, ended int64 }
	per := map[string]map[int64]*marks{}
	for _, row := range b.rows(`SELECT c.device_id, c.serial_seq, e.from_state, e.to_state, e.at FROM events e
		JOIN commands c ON c.command_id = e.entity_id
		WHERE e.machine = 'command' AND e.refused = 0 AND c.serial_seq IS NOT NULL ORDER BY e.id`) {
		f := strings.Split(row, "|")
		seq, _ := strconv.ParseInt(f[1], 10, 64)
		at, _ := strconv.ParseInt(f[4], 10, 64)
		if per[f[0]] == nil {
			per[f[0]] = map[int64]*marks{}
		}
		m := per[f[0]][seq]
		if m == nil {
			m = &marks{}
			per[f[0]][seq] = m
		}
		switch to := f[3]; {
		case f[2] == "":
			m.submitted = at
		case to == "sent" && m.published == 0:
			m.published = at
		case to == "succeeded" || to == "failed" || to == "timeout" || to == "cancelled":
			m.ended = at
		}
	}
	var gaps []time.Duration
	for _, seqs := range per {
		for seq, m := range seqs {
			next := seqs[seq+1]
			if m.ended == 0 || next == nil || next.published == 0 || next.submitted > m.ended {
				continue
			}
			gaps = append(gaps, time.Duration(next.published-m.ended)*time.Millisecond)
		}
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	return gaps
}

// Serial commands under load from several callers through two instances
// on one PostgreSQL, with device faults, and an instance killed with
// SIGKILL (then restarted) again and again: every accepted operation ends
// succeeded, each runs once, and on every device the serial commands ran
// one at a time in the order their submits committed (the devices' log),
// invariant 10 among the checker's verdicts.
func TestSerialCommandsRunInSubmitOrderThroughKills(t *testing.T) {
	t.Parallel()
	const ops, devices, callers, wantKills = 400, 20, 8, 8
	profile := sim.Profile{Seed: 28, Defaults: sim.Faults{
		DropReceipt:      sim.ReceiptFault{Trigger: sim.Trigger{P: 0.05}, Statuses: []string{sim.ClassFinal}},
		DuplicateReceipt: sim.ReceiptFault{Trigger: sim.Trigger{P: 0.05}},
		DropCommand:      sim.Trigger{P: 0.02},
		SlowExecution:    sim.ActionFault{Trigger: sim.Trigger{P: 0.3}, Delay: sim.Duration(200 * time.Millisecond)},
	}}
	args := append([]string{"--lease-ttl", "2s"}, policyArgs(t, `{"defaults":{"concurrency":"serial"}}`)...)
	b := setup(t, setupOpts{backend: "postgres", devices: devices, faults: profile, args: args})
	ctls := []*testenv.Controller{b.ctl}
	clients := []*client.Client{b.client}
	c2, cl2 := b.peer("i2", nil, args...)
	ctls, clients = append(ctls, c2), append(clients, cl2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Submit from several callers through both instances, and kill -9 an
	// instance (then restart it) wantKills times, spread over the submits.
	rr := submitRoundRobin(ctx, clients, ops, callers, func(i int) apiwire.SubmitRequest {
		return req(fmt.Sprintf("serial-%04d", i), fmt.Sprintf("device-%d", i%devices+1))
	})
	byInstance := killDuring(t, ctx, rand.New(rand.NewSource(28)), ctls, rr, ops, wantKills)
	kills := 0
	for _, n := range byInstance {
		kills += n
	}
	rr.wg.Wait()
	require.EqualValues(t, ops, rr.accepted.Load(), "every operation was accepted by some instance")

	final := map[string]int{}
	for i := 0; i < ops; i++ {
		final[b.waitFinal(fmt.Sprintf("serial-%04d:restart:device-%d:v1", i, i%devices+1)).Status]++
	}
	require.Equal(t, ops, final["succeeded"], "every accepted operation ends succeeded: %v", final)
	for id, n := range b.executions() {
		require.Equal(t, 1, n, "%s executed %d times", id, n)
	}
	t.Logf("%d serial operations over %d devices from %d callers through 2 instances, %d kill -9s: %v",
		ops, devices, callers, kills, final)
	gaps := b.queueGaps()
	require.NotEmpty(t, gaps)
	t.Logf("from a serial command's end to the next one's publish (%d already queued): p50 %s, p90 %s, max %s",
		len(gaps), gaps[len(gaps)/2], gaps[len(gaps)*9/10], gaps[len(gaps)-1])
	b.verifySerial(ops, devices)
}

// Supersede with the device offline: five intents of one action leave one
// that runs; each of the four older is cancelled unpublished, its
// operation failed_final superseded_by the next; nothing superseded is
// ever published; a replay of a superseded POST answers its record.
func TestSupersedeLeavesTheLatestIntentWhileOffline(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		b := setup(t, setupOpts{backend: be,
			args: policyArgs(t, `{"actions":{"set-config":{"concurrency":"serial","supersede":true}}}`)})
		sn := sniff(t, b.broker.URL())
		dev := b.fleet.Device("device-1")
		dev.DropConnection(0)
		b.waitDevice("device-1", false)
		intent := func(v int) apiwire.SubmitRequest {
			return apiwire.SubmitRequest{TaskID: "tune", Step: "set", Target: "device-1", BusinessVersion: fmt.Sprintf("v%d", v),
				Action: "set-config", Params: json.RawMessage(fmt.Sprintf(`{"setpoint":%d}`, 20+v))}
		}
		var ids []string
		for v := 1; v <= 5; v++ {
			op, status, err := b.client.Submit(b.ctx(), intent(v), "")
			require.NoError(t, err)
			require.Equal(t, http.StatusCreated, status)
			ids = append(ids, op.OperationID)
		}
		for i := 0; i < 4; i++ {
			op, err := b.client.Operation(b.ctx(), ids[i], 0)
			require.NoError(t, err)
			require.Equal(t, "failed_final", op.Status)
			require.Equal(t, "superseded_by:"+ids[i+1], op.Reason)
			c := b.command(op.CommandID)
			require.Equal(t, "cancelled", c.Status)
			require.Equal(t, "superseded", c.Reason)
			require.Zero(t, c.Attempt)
		}
		d := b.deviceQueue("device-1")
		last, err := b.client.Operation(b.ctx(), ids[4], 0)
		require.NoError(t, err)
		require.Equal(t, []string{last.CommandID}, d.Queued, "one intent left, waiting for the device")

		replay, status, err := b.client.Submit(b.ctx(), intent(2), "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "failed_final", replay.Status, "a replay answers the record, never resurrects it")

		dev.Reconnect()
		require.Equal(t, "succeeded", b.waitFinal(ids[4]).Status)
		require.Equal(t, map[string]int{ids[4]: 1}, b.executions(), "only the latest intent ran")
		require.Equal(t, json.RawMessage(`25`), dev.Config()["setpoint"])
		for i := 0; i < 4; i++ {
			cmds, _ := sn.of(ids[i])
			require.Empty(t, cmds, "%s was superseded: never published", ids[i])
		}
		cmds, _ := sn.of(ids[4])
		require.Len(t, cmds, 1)
		b.verify()
	})
}

// The failure windows of the queue, entered on purpose against the real
// binary: the controller crashes between the head's committed
// pending → sent (the slot's write) and its publish, with two more queued
// behind it; after the restart the head is asked about and published
// again under the same command_id, and the queue goes on in order. Then
// the device goes offline with a queue, the controller is killed -9, and
// the queue waits out the restart and the absence, in order.
func TestSerialQueueThroughCrashesAndAnOfflineDevice(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		args := policyArgs(t, `{"actions":{"restart":{"concurrency":"serial"}}}`)
		b := setup(t, setupOpts{backend: be, args: args, env: []string{"CONTROLLER_FAILPOINTS=before-publish=1*crash"}})
		var ids []string
		crashes := 0
		submit := func(name string) apiwire.Operation {
			r := req(name, "device-2")
			for {
				op, status, err := b.client.Submit(b.ctx(), r, "")
				if err == nil && (status == http.StatusCreated || status == http.StatusOK) {
					return op
				}
				// The crash may come before the answer: the controller is
				// restarted below, and the same POST is safe to send again.
				require.Equal(t, 137, b.ctl.ExitCode(), "only the failpoint's crash stops it: %v", err)
				b.ctl.Restart()
				crashes++
			}
		}
		for _, name := range []string{"fp-1", "fp-2", "fp-3"} {
			ids = append(ids, submit(name).OperationID)
		}
		if crashes == 0 { // it crashed after the last answer: the restart is the test's
			require.Equal(t, 137, b.ctl.ExitCode(), "crashed after the head's pending → sent commit")
			b.ctl.Restart()
			crashes++
		}
		require.Equal(t, 1, crashes)
		for _, id := range ids {
			require.Equal(t, "succeeded", b.waitFinal(id).Status)
		}
		first, err := b.client.Operation(b.ctx(), ids[0], 0)
		require.NoError(t, err)
		require.Equal(t, []string{first.CommandID}, first.CommandIDs, "no new command_id after the crash")

		// Offline with a queue, and a kill -9 while it waits.
		dev := b.fleet.Device("device-2")
		dev.DropConnection(0)
		b.waitDevice("device-2", false)
		var queued []string
		for _, name := range []string{"off-1", "off-2", "off-3"} {
			queued = append(queued, submit(name).OperationID)
		}
		head, err := b.client.Operation(b.ctx(), queued[0], 0)
		require.NoError(t, err)
		b.waitCommand(head.CommandID, "waiting_device")
		d := b.deviceQueue("device-2")
		require.Len(t, d.Queued, 3, "the head waits for the device, the others behind it")
		second, err := b.client.Operation(b.ctx(), queued[1], 0)
		require.NoError(t, err)
		c := b.command(second.CommandID)
		require.Equal(t, "pending", c.Status)
		require.Equal(t, "queued", c.Reason)
		require.Equal(t, head.CommandID, c.QueuedBehind)

		b.ctl.Kill()
		b.ctl.Restart()
		dev.Reconnect()
		for _, id := range queued {
			require.Equal(t, "succeeded", b.waitFinal(id).Status)
		}
		b.verifySerial(6, 1)
	})
}

// A takeover by a second instance on PostgreSQL: i1 holds a device's serial
// queue, one command executing (each takes 700 ms on the device) and three
// behind it, and is killed -9 for good; i2 takes the operations over
// within the lease ttl, asks about the one in flight, and publishes the
// rest one at a time, in submit order.
func TestSerialQueueTakenOverByASecondInstance(t *testing.T) {
	t.Parallel()
	profile := sim.Profile{Seed: 5, Defaults: sim.Faults{
		SlowExecution: sim.ActionFault{Trigger: sim.Trigger{P: 1}, Delay: sim.Duration(700 * time.Millisecond)}}}
	args := append([]string{"--lease-ttl", "2s"}, policyArgs(t, `{"actions":{"restart":{"concurrency":"serial"}}}`)...)
	b := setup(t, setupOpts{backend: "postgres", faults: profile, args: args})
	_, cl2 := b.peer("i2", nil, args...)
	var ids []string
	for i := 1; i <= 4; i++ {
		op, _, err := b.client.Submit(b.ctx(), req(fmt.Sprintf("take-%d", i), "device-1"), "")
		require.NoError(t, err)
		require.Equal(t, "i1", op.Owner)
		ids = append(ids, op.OperationID)
	}
	head, err := b.client.Operation(b.ctx(), ids[0], 0)
	require.NoError(t, err)
	eventually(t, "the head executing on the device", 30*time.Second, func() bool {
		return b.command(head.CommandID).Status == "executing"
	})
	q := b.deviceQueue("device-1")
	require.Equal(t, []string{head.CommandID}, q.InFlight)
	require.Len(t, q.Queued, 3)
	b.ctl.Kill()

	for _, id := range ids {
		op := b.waitFinalAt(cl2, id)
		require.Equal(t, "succeeded", op.Status, "%s", id)
		require.Equal(t, "i2", op.Owner, "%s taken over by i2", id)
	}
	b.verifySerial(4, 1)
}

// A device's queue moves from one instance to the other without waiting
// for a poll: two instances on one PostgreSQL take turns submitting serial
// commands to a few devices, so a command often ends on one instance
// while the next is being submitted on the other, neither transaction
// seeing the other's. With --ack-timeout 30s a queued command's own
// fallback check comes only after 4 minutes: every operation must end
// long before, and no gap from an end to the next publish is near it.
func TestSerialQueueMovesAcrossInstancesAtOnce(t *testing.T) {
	t.Parallel()
	const ops, devices, callers = 240, 4, 16
	args := append([]string{"--ack-timeout", "30s"}, policyArgs(t, `{"defaults":{"concurrency":"serial"}}`)...)
	b := setup(t, setupOpts{backend: "postgres", devices: devices, args: args})
	_, cl2 := b.peer("i2", nil, args...)
	clients := []*client.Client{b.client, cl2}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				r := req(fmt.Sprintf("turns-%04d", i), fmt.Sprintf("device-%d", i%devices+1))
				op, _, err := clients[i%2].Submit(ctx, r, "")
				if err != nil {
					t.Errorf("submit %d: %v", i, err)
					return
				}
				for op.Status == "started" && ctx.Err() == nil {
					if op, err = clients[i%2].Operation(ctx, op.OperationID, 10*time.Second); err != nil {
						t.Errorf("wait %d: %v", i, err)
						return
					}
				}
				if op.Status != "succeeded" {
					t.Errorf("%s ended %s", op.OperationID, op.Status)
				}
			}
		}()
	}
	start := time.Now()
	for i := 0; i < ops && ctx.Err() == nil; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	require.NoError(t, ctx.Err(), "every operation ended within 90 s")
	gaps := b.queueGaps()
	require.NotEmpty(t, gaps)
	t.Logf("%d serial operations on %d devices through 2 instances in %s; from an end to the next publish (%d queued): p50 %s, p99 %s, max %s",
		ops, devices, time.Since(start).Round(time.Millisecond), len(gaps), gaps[len(gaps)/2], gaps[len(gaps)*99/100], gaps[len(gaps)-1])
	require.Less(t, gaps[len(gaps)-1], 10*time.Second, "no queue waited for a poll")
	b.verifySerial(ops, devices)
}

// The slot's write and the publish, with the holder stalled between them
// on purpose: i1 commits the head's pending → sent, then stalls (and its
// heartbeat with it) longer than its lease; i2 takes the device's three
// serial operations over, asks about the head, re-sends it under the same
// command_id and publishes the other two one at a time, in order; i1
// wakes and its publish is dropped (fenced). Nothing ran twice, nothing
// overlapped.
func TestSerialHeadStalledBetweenItsSlotAndItsPublish(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, be string) {
		args := append([]string{"--lease-ttl", "2s"}, policyArgs(t, `{"actions":{"restart":{"concurrency":"serial"}}}`)...)
		b := setup(t, setupOpts{backend: be, args: args,
			env: []string{"CONTROLLER_FAILPOINTS=before-publish=1*sleep(6s);before-lease-renew=1*sleep(6s)"}})
		sn := sniff(t, b.broker.URL())
		b.peer("i2", nil, args...)
		var ids []string
		for i := 1; i <= 3; i++ {
			op, _, err := b.client.Submit(b.ctx(), req(fmt.Sprintf("stall-%d", i), "device-1"), "")
			require.NoError(t, err)
			ids = append(ids, op.OperationID)
		}
		for _, id := range ids {
			final := b.waitFinal(id)
			require.Equal(t, "succeeded", final.Status, id)
			require.Equal(t, "i2", final.Owner, "%s: the survivor finished it", id)
		}
		eventually(t, "i1 wakes and drops its publish", 15*time.Second, func() bool {
			return b.metric("controller_fencing_refused_total") >= 1
		})
		require.Zero(t, b.metric(`controller_publishes_total{kind="command"}`), "nothing i1 did reached a device")
		cmds, _ := sn.of(ids[0])
		require.Len(t, cmds, 1, "the head on the wire once: i2's re-send")
		require.Equal(t, 2, cmds[0].cmd.Attempt)
		b.verifySerial(3, 1)
	})
}
