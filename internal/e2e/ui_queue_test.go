package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/sim"
)

// heldQueue is a device's serial queue held by its head: restart is serial
// (the policy file); device-2 is a legacy device (no dedupe) whose first
// final receipt is lost and which answers no query, so the first of three
// restarts submitted to it goes needs_attention and holds the device, the
// other two queued behind it in submit order.
type heldQueue struct {
	*bundle
	ids [3]string // the three commands, in submit order
}

func holdQueue(t *testing.T) heldQueue {
	t.Helper()
	b := setup(t, setupOpts{args: append([]string{"--ack-timeout", "300ms", "--max-attempts", "2"},
		policyArgs(t, `{"actions":{"restart":{"concurrency":"serial"}}}`)...),
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{
			Legacy:        sim.Legacy{Enabled: true, Dedupe: false, Query: true},
			DropReceipt:   sim.ReceiptFault{Trigger: sim.Trigger{Count: 1}, Statuses: []string{sim.ClassFinal}},
			IgnoreQueries: sim.Trigger{P: 1},
		}}}}})
	eventually(t, "legacy capabilities seen", 10*time.Second, func() bool {
		d, err := b.client.Device(b.ctx(), "device-2")
		return err == nil && d.Seen && !d.Capabilities.Dedupe
	})
	h := heldQueue{bundle: b}
	for i := range h.ids {
		op, status, err := b.client.Submit(b.ctx(), req(fmt.Sprintf("queue-%d", i+1), "device-2"), "")
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		h.ids[i] = op.CommandID
	}
	b.waitCommand(h.ids[0], "needs_attention")
	d, err := b.client.Device(b.ctx(), "device-2")
	require.NoError(t, err)
	require.Equal(t, h.ids[:1], d.InFlight, "the head holds the device")
	require.Equal(t, h.ids[1:], d.Queued, "the others in submit order")
	for i, id := range h.ids[1:] {
		c := b.command(id)
		require.Equal(t, "pending", c.Status)
		require.Equal(t, "queued", c.Reason)
		require.Zero(t, c.Attempt, "never published")
		require.Equal(t, h.ids[i], c.QueuedBehind)
		require.EqualValues(t, i+2, c.SerialSeq)
	}
	return h
}

// resolve says the head really succeeded: the device is free, the two
// behind it are published one after the other and succeed.
func (h heldQueue) resolve() {
	var out apiwire.Command
	status, err := h.client.Do(h.ctx(), http.MethodPost, "/v1/commands/"+h.ids[0]+"/resolve", nil,
		apiwire.ResolveRequest{Outcome: "succeeded", Note: "seen on the console"}, &out)
	require.NoError(h.t, err)
	require.Equal(h.t, http.StatusOK, status)
}

// finished checks the two behind the head ran, the second after the first
// ended: published in submit order, never overlapping.
func (h heldQueue) finished() {
	second, third := h.waitCommand(h.ids[1], "succeeded"), h.waitCommand(h.ids[2], "succeeded")
	require.NotNil(h.t, second.LastSentAt)
	require.NotNil(h.t, third.LastSentAt)
	var secondEnded time.Time
	for _, e := range second.Events {
		if e.To == "succeeded" {
			secondEnded = e.At
		}
	}
	require.False(h.t, third.LastSentAt.Before(secondEnded), "the third published after the second ended")
	d, err := h.client.Device(h.ctx(), "device-2")
	require.NoError(h.t, err)
	require.Empty(h.t, d.InFlight)
	require.Empty(h.t, d.Queued)
}

// The dashboard's device view shows the queue: the head in flight
// (needs_attention), the two others queued in submit order, each a link
// to its command, whose view names the command ahead and its number. When
// a person resolves the head, the queue empties on the page, live.
func TestDeviceQueueInChromium(t *testing.T) {
	t.Parallel()
	h := holdQueue(t)
	c := startChrome(t)
	c.do("open the device", chromedp.Navigate(h.ctl.URL+"/ui/#/devices/device-2"), chromedp.WaitVisible(chromedp.CSS("#device")))
	ids := func(list string) string {
		return fmt.Sprintf(`[...document.querySelectorAll("#%s li[data-id]")].map(l => l.dataset.id).join(" ")`, list)
	}
	// count is a list's count as shown ("" before the first read).
	count := func(list string) string {
		return fmt.Sprintf(`(e => e === null ? "" : e.textContent)(document.getElementById("%s-count"))`, list)
	}
	c.wait("one in flight, two queued in submit order", fmt.Sprintf(`%s === "1" && %s === "2" && %s === %s && %s === %s`,
		count("device-in-flight"), count("device-queued"), ids("device-in-flight"), q(h.ids[0]), ids("device-queued"), q(h.ids[1]+" "+h.ids[2])), 15*time.Second)
	c.wait("the head's status, the others'", fmt.Sprintf(
		`(l => l !== null && l.dataset.status === "needs_attention")(document.querySelector("#device-in-flight li")) && `+
			`[...document.querySelectorAll("#device-queued li")].every(l => l.dataset.status === "pending") && %s`,
		`(a => a !== null && a.getAttribute("href") === "#/commands/"+`+q(h.ids[1])+`)(document.querySelector("#device-queued li a"))`), 15*time.Second)
	c.screenshot("device-queue")

	c.do("open the last one queued", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#device-queued li[data-id=%s] a`, q(h.ids[2])))),
		chromedp.WaitVisible(chromedp.CSS("#command")))
	c.wait("it names the one ahead and its number", fmt.Sprintf(
		`(a => a !== null && a.textContent === %s)(document.getElementById("queued-behind")) && (s => s !== null && s.textContent.includes("3"))(document.getElementById("serial-seq"))`,
		q(h.ids[1])), 15*time.Second)
	c.screenshot("command-queued")
	c.do("follow the link to the one ahead", chromedp.Click(chromedp.CSS("#queued-behind")))
	c.wait("its view, behind the head", fmt.Sprintf(`(c => c !== null && c.dataset.id === %s)(document.getElementById("command")) && `+
		`(a => a !== null && a.textContent === %s)(document.getElementById("queued-behind"))`, q(h.ids[1]), q(h.ids[0])), 15*time.Second)
	c.do("back to the device through its link", chromedp.Click(chromedp.CSS(`#command dd a[href^="#/devices/"]`)),
		chromedp.WaitVisible(chromedp.CSS("#device")))
	c.wait("the queue again", ids("device-queued")+" === "+q(h.ids[1]+" "+h.ids[2]), 15*time.Second)

	h.resolve()
	c.wait("the queue empties, live", count("device-in-flight")+` === "0" && `+count("device-queued")+` === "0" && `+
		`document.getElementById("device-in-flight-empty") !== null && document.getElementById("device-queued-empty") !== null`, 30*time.Second)
	h.finished()
	c.screenshot("device-queue-empty")
	require.Empty(t, c.exceptions(), "the page threw")
}

// The CLI shows the same: 'device get' the commands in flight and queued,
// in order (text, and JSON from the API's body); 'cmd get' a queued
// command's number and the one ahead.
func TestDeviceQueueInTheCLI(t *testing.T) {
	t.Parallel()
	h := holdQueue(t)
	out, err := h.run("device", "get", "device-2")
	require.NoError(t, err, out)
	require.Contains(t, out, fmt.Sprintf("in_flight: 1\n  1. %s\n", h.ids[0]), out)
	require.Contains(t, out, fmt.Sprintf("queued: 2\n  1. %s\n  2. %s\n", h.ids[1], h.ids[2]), out)
	out, err = h.run("device", "get", "device-2", "--json")
	require.NoError(t, err, out)
	var d apiwire.DeviceDetail
	require.NoError(t, json.Unmarshal([]byte(out), &d), out)
	require.Equal(t, "device-2", d.DeviceID)
	require.Equal(t, h.ids[:1], d.InFlight)
	require.Equal(t, h.ids[1:], d.Queued)

	out, err = h.run("cmd", "get", h.ids[2])
	require.NoError(t, err, out)
	require.Regexp(t, `status\s+pending \(queued\)`, out)
	require.Regexp(t, `serial_seq\s+3\n`, out)
	require.Regexp(t, `queued_behind\s+`+h.ids[1]+`\n`, out)
	out, err = h.run("cmd", "get", h.ids[0])
	require.NoError(t, err, out)
	require.Regexp(t, `serial_seq\s+1\n`, out)
	require.NotContains(t, out, "queued_behind", "the head waits behind nothing")

	h.resolve()
	h.finished()
	out, err = h.run("device", "get", "device-2")
	require.NoError(t, err, out)
	require.Contains(t, out, "in_flight: 0\n", out)
	require.Contains(t, out, "queued: 0\n", out)
	out, err = h.run("cmd", "get", h.ids[2])
	require.NoError(t, err, out)
	require.Regexp(t, `serial_seq\s+3\n`, out)
	require.NotContains(t, out, "queued_behind", "published: no longer queued")
}
