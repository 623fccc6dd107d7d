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
	"github.com/fleetctl/fleetctl/internal/client"
	"github.com/fleetctl/fleetctl/internal/sim"
)

// The dashboard's Needs attention page in headless Chromium: two commands
// to a legacy device (no dedupe, its finals lost, its queries ignored) wait
// for a person. They are in GET /v1/commands?status=needs_attention, the
// CLI's cmd list, the gauge and the page's queue, which shows them oldest
// first with their evidence (the queries asked and unanswered, the
// device's capabilities); the navigation counts them. An operator resolves
// the oldest on the page with a note: it leaves all four, live, and the
// resolve is in GET /v1/audit?principal= with its note.
func TestNeedsAttentionQueueInChromium(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t, setupOpts{args: []string{"--ack-timeout", "300ms", "--max-attempts", "2"},
		faults: sim.Profile{Devices: []sim.Override{{Match: "device-2", Faults: sim.Faults{
			Legacy:        sim.Legacy{Enabled: true, Dedupe: false, Query: true},
			DropReceipt:   sim.ReceiptFault{Trigger: sim.Trigger{P: 1}, Statuses: []string{sim.ClassFinal}},
			IgnoreQueries: sim.Trigger{P: 1},
		}}}}})
	eventually(t, "legacy capabilities seen", 10*time.Second, func() bool {
		d, err := tb.client.Device(tb.ctx(), "device-2")
		return err == nil && d.Seen && !d.Capabilities.Dedupe
	})
	submit := func(task, target string) apiwire.Operation {
		var op apiwire.Operation
		status, err := tb.agent.Do(tb.ctx(), http.MethodPost, "/v1/operations", nil, apiwire.SubmitRequest{TaskID: task, Step: "configure",
			Target: target, BusinessVersion: "v1", Action: "set-config", Params: []byte(`{"fw":"4.2"}`)}, &op)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status)
		return op
	}
	first := submit("legacy-1", "device-2")
	tb.waitCommand(first.CommandID, "needs_attention")
	second := submit("legacy-2", "device-2")
	tb.waitCommand(second.CommandID, "needs_attention")
	fine := submit("fine", "device-1")
	require.Equal(t, "succeeded", tb.waitFinal(fine.OperationID).Status)

	// The four places a person finds what waits for them, but the page.
	waiting := func() (api, cli []string, gauge float64) {
		listed, err := tb.viewer.ListCommands(tb.ctx(), client.CommandQuery{Statuses: []string{"needs_attention"}})
		require.NoError(t, err)
		for _, c := range listed {
			api = append(api, c.CommandID)
		}
		out, err := tb.run("cmd", "list", "--status", "needs_attention", "--all", "--json", "--token", "t-viewer")
		require.NoError(t, err, out)
		var printed []apiwire.Command
		require.NoError(t, json.Unmarshal([]byte(out), &printed), out)
		for _, c := range printed {
			cli = append(cli, c.CommandID)
		}
		return api, cli, tb.metric(`controller_commands{status="needs_attention"}`)
	}
	both := []string{second.CommandID, first.CommandID} // newest first
	eventually(t, "both waiting in the API list, the CLI list and the gauge", 20*time.Second, func() bool {
		api, cli, gauge := waiting()
		return fmt.Sprint(api) == fmt.Sprint(both) && fmt.Sprint(cli) == fmt.Sprint(both) && gauge == 2
	})

	c := startChrome(t)
	c.do("open the dashboard", chromedp.Navigate(tb.ctl.URL+"/ui/#/attention"), chromedp.WaitVisible(chromedp.CSS("#login-form")))
	c.do("sign in as bob, an operator", chromedp.SendKeys(chromedp.CSS("#token"), "t-bob"), chromedp.Click(chromedp.CSS("#login-form button")))
	c.wait("the navigation counts two", `document.getElementById("attention-badge").textContent === "2" && !document.getElementById("attention-badge").hidden`, 15*time.Second)
	c.wait("the queue shows two", `document.querySelectorAll("#attention-queue article.attention").length === 2`, 15*time.Second)
	require.Equal(t, "2", c.eval(`document.getElementById("attention-total").textContent`))
	require.Equal(t, first.CommandID+" "+second.CommandID,
		c.eval(`[...document.querySelectorAll("#attention-queue article.attention")].map(a => a.dataset.id).join(" ")`), "oldest first")
	card := fmt.Sprintf(`#attention-queue article[data-id=%s]`, q(first.CommandID))
	c.wait("its evidence: two queries asked, none answered, the device's capabilities", fmt.Sprintf(
		`(a => a !== null && a.querySelectorAll("li.query").length === 2 && a.querySelectorAll('li.query[data-answer=""]').length === 2 && a.querySelector(".presence").textContent.includes("dedupe no"))(document.querySelector(%s))`,
		q(card)), 15*time.Second)
	c.screenshot("attention")

	c.do("resolve the oldest as succeeded, with a note",
		chromedp.Click(chromedp.CSS(card+" input.outcome-succeeded")),
		chromedp.SendKeys(chromedp.CSS(card+" input.note"), "config 4.2 seen on the device's console"),
		chromedp.Click(chromedp.CSS(card+" button.resolve")))
	c.wait("it leaves the queue and the badge", fmt.Sprintf(`document.querySelector(%s) === null && document.getElementById("attention-badge").textContent === "1"`, q(card)), 15*time.Second)
	resolved := tb.command(first.CommandID)
	require.Equal(t, "succeeded", resolved.Status)
	require.Equal(t, "bob", resolved.ResolvedBy)
	eventually(t, "the resolved one left the API list, the CLI list and the gauge", 20*time.Second, func() bool {
		api, cli, gauge := waiting()
		return fmt.Sprint(api) == fmt.Sprint(both[:1]) && fmt.Sprint(cli) == fmt.Sprint(both[:1]) && gauge == 1
	})
	audit, err := tb.viewer.ListAudit(tb.ctx(), client.AuditQuery{Principal: "bob"})
	require.NoError(t, err)
	require.Len(t, audit, 1, "bob's one change")
	require.Equal(t, "resolve", audit[0].Action)
	require.Equal(t, first.CommandID, audit[0].ID)
	var detail map[string]any
	require.NoError(t, json.Unmarshal(audit[0].Detail, &detail))
	require.Equal(t, "config 4.2 seen on the device's console", detail["note"])
	require.Equal(t, "succeeded", detail["outcome"])

	// The Commands page, filtered on needs_attention from the database: the
	// one left; and on succeeded: the resolved one and the fine one.
	c.do("open commands waiting for a person", chromedp.Click(chromedp.CSS(`#nav a[data-view="commands"]`)), chromedp.WaitVisible(chromedp.CSS("#commands-filter")))
	c.do("filter needs_attention", chromedp.SetValue(chromedp.CSS("#filter-status"), "needs_attention"), chromedp.Click(chromedp.CSS("#commands-filter button")))
	c.wait("one row, the second", fmt.Sprintf(`document.getElementById("commands-total").textContent === "1" && `+
		`[...document.querySelectorAll("#commands tbody tr[data-id]")].map(r => r.dataset.id).join(" ") === %s`, q(second.CommandID)), 15*time.Second)
	require.Contains(t, c.eval(`location.hash`), "status=needs_attention", "the filter is in the address")
	c.do("filter succeeded", chromedp.SetValue(chromedp.CSS("#filter-status"), "succeeded"), chromedp.Click(chromedp.CSS("#commands-filter button")))
	c.wait("the resolved and the fine one, newest first", fmt.Sprintf(`[...document.querySelectorAll("#commands tbody tr[data-id]")].map(r => r.dataset.id).join(" ") === %s`,
		q(fine.CommandID+" "+first.CommandID)), 15*time.Second)
	c.screenshot("commands-filtered")

	// The last one resolved through the API: the queue empties, live.
	c.do("back to the queue", chromedp.Click(chromedp.CSS(`#nav a[data-view="attention"]`)), chromedp.WaitVisible(chromedp.CSS("#attention-queue")))
	c.wait("one waits", `document.querySelectorAll("#attention-queue article.attention").length === 1`, 15*time.Second)
	var out apiwire.Command
	status, err := tb.bob.Do(tb.ctx(), http.MethodPost, "/v1/commands/"+second.CommandID+"/resolve", nil,
		apiwire.ResolveRequest{Outcome: "failed", Note: "the device was replaced"}, &out)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	c.wait("the queue empties and the badge hides, live", `document.getElementById("attention-empty") !== null && document.getElementById("attention-badge").hidden`, 15*time.Second)
	require.Empty(t, c.exceptions(), "the page threw")
}
