package driver

import (
	"bufio"
	"fmt"
	"reflect"
	"strings"
)

// Statements are a backend's whole statements, each in the backend's own
// dialect (its placeholders, its lock clauses written in), by name. Each
// backend fills its set from its embedded queries.sql, whose statements
// start with a "-- name: <Field>" line (sqlc's and River's style); Parse
// refuses a file that misses a field, names one twice or names one that
// does not exist, so a misspelt name fails at init, and the store refers
// to statements by field, so a misspelt reference fails to compile.
// Whole-line comments ("--" first) are the file's own and are dropped.
type Statements struct {
	// Migrations.
	SchemaTable, SchemaVersion, SchemaApplied string

	// The heads (up to VALUES) of the multi-row INSERTs of a batch's lines
	// of the events log and of the receipt log; the store appends the rows.
	EventsInsertHead, ReceiptsInsertHead string

	// The batch's pre-lock (Capabilities.RowLocks).
	PreLockCommands, PreLockInsertDevices, PreLockDevices, PreLockQueues string

	// Reads of one row, plain and inside a write transaction.
	CommandGet, CommandGetForUpdate           string
	OperationGetRow, OperationGetRowForUpdate string
	OperationGet, OperationGetForUpdate       string
	OperationsEnded                           string
	RolloutGetRow, RolloutGetRowForUpdate     string

	// Fenced decisions about a command, and the fences' explanations.
	CommandClaimSend, CommandClaimQuery, CommandPostpone, CommandMove string
	CommandFenceHeld, OperationFenceHeld                              string

	// Changes that move a lease to a new token or take rows in bulk.
	OperationStartRetry                        string
	LeaseRenew, LeaseReclaimOwn, LeaseTakeOver string
	DeviceTouch, DeviceUnconfirmAll            string

	// commands.go: a command's receipts, a decision's lease read-back,
	// queries, wake-ups.
	ReceiptList, OperationLeaseExpiry, QueryInsert, CommandWakeDevice string

	// operations.go: submit, commands' insert, outcomes
	OperationInsert, CommandInsert, CommandInsertForDevice, OperationCommandInsert string
	OperationFinish, OperationFinishCurrent, CommandSupersede                      string

	// queues.go: per-device ordering and supersede
	QueueNext, QueueAhead, QueueHead, QueueSupersedable, QueueInFlight, QueueWaiting string

	// retry.go: retries, cancel, resolve
	CommandRetryAsk, OperationRetrying, OperationRetryingCommands string
	OperationMintCommand, OperationAbandonRetry, CommandCancel    string
	CommandLateResolve, CommandResolve                            string

	// leases.go: instances and leases
	InstanceList, LeaseLastExpiry, LeaseCountExpired, CommandForgetQuestions string

	// devices.go: presence
	DeviceGet, DeviceInsert, DeviceStalePresence, DevicePresence, DeviceResetPresence string

	// receipts.go: receipts and answers
	QueryCommand, QueryAnswer, CommandLastAnswer, CommandDueNow                                string
	CommandUnpark, CommandAdvance, CommandAdvanceFrom, CommandLateConflict, CommandLateOutcome string
	CommandAdvanceFinish                                                                       string

	// rollouts.go: rollouts, their devices, starts and history
	RolloutCounts, RolloutStartsSince, RolloutHistoryInsert               string
	DeviceListSeen, RolloutCreateHash, RolloutInsert, RolloutDeviceInsert string
	RolloutHistoryList, RolloutStartList, RolloutApprove, RolloutMove     string
	RolloutCancelWaiting, RolloutUnpublished, RolloutCancelDevice         string
	RolloutListActive, RolloutAcquire, RolloutNextCandidate, RolloutRenew string
	RolloutDeviceGet, RolloutCountStart, RolloutDeviceStart               string
	RolloutStartInsert, RolloutDeviceFailStart, RolloutSettleList         string
	RolloutDeviceSettle, RolloutProvisional                               string

	// audit.go: the audit's reads (one snapshot, read-only)
	SchemaCount, AuditOperationsByStatus, AuditCommandsByStatus     string
	AuditReceiptsByInstance, AuditReceiptsByEffect, AuditOperations string
	AuditCommands, AuditLegacyDevices, AuditQueries                 string

	// audit_rollouts.go: the audit's reads of rollouts
	AuditRollouts, AuditRolloutStarts string

	// audit_serial.go: the audit's read of serial commands (issue 28: invariant 10)
	AuditSerialCommands string

	// Lists with a variant each: the events log, open commands, heartbeats.
	EventList, EventListOf, EventListPresence    string
	CommandListDue, CommandListOpen, CommandOpen string
	InstanceHeartbeat, InstanceHeartbeatStart    string

	// Tasks and grants (store/tasks.go, store/grants.go).
	TaskHistoryInsert, TaskCreateHash, TaskInsert, TaskVersionInsert               string
	TaskState, TaskVersionHash, TaskNewVersion, TaskApprovalGet, TaskVersionAuthor string
	TaskApprove, TaskApprovalInsert, TaskRejectState, TaskMove, TaskMoveFenced     string
	TaskFenceHeld, TaskListActive, TaskLeaseGetForUpdate, TaskAcquire, TaskRenew   string
	TaskGet, TaskStepOperationStatus, TaskDeviceSeen, TaskHistoryList              string
	TaskApprovalRead, GrantInsert, GrantLive, GrantRevoke, GrantGet, GrantsOf      string

	// auditlog.go: the audit log of people's changes, the events of one
	// entity with their principal, the state gauges' counts (issue 27).
	AuditInsert, EventListOfBy, OperationStatusCounts, CommandStatusCounts string
	OperationOpenStatusCounts, CommandOpenStatusCounts                     string

	// oplists.go: the lists by device take the pending rows in bulk
	// (Capabilities.ListsDevicesInBulk).
	DeviceListOperations, DeviceListCommands string
}

// Parse reads a queries.sql file into a Statements.
func Parse(src string) (*Statements, error) {
	out := &Statements{}
	v := reflect.ValueOf(out).Elem()
	seen := map[string]bool{}
	var name string
	var body strings.Builder
	flush := func() error {
		if name == "" {
			if strings.TrimSpace(body.String()) != "" {
				return fmt.Errorf("queries: text before the first -- name: line")
			}
			return nil
		}
		f := v.FieldByName(name)
		if !f.IsValid() || f.Kind() != reflect.String {
			return fmt.Errorf("queries: %s is not a statement of driver.Statements", name)
		}
		if seen[name] {
			return fmt.Errorf("queries: %s is defined twice", name)
		}
		seen[name] = true
		text := strings.TrimSpace(body.String())
		text = strings.TrimSuffix(text, ";")
		if text == "" {
			return fmt.Errorf("queries: %s is empty", name)
		}
		f.SetString(text)
		return nil
	}
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			name = strings.TrimSpace(n)
			body.Reset()
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue // a comment line: not part of any statement
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := flush(); err != nil {
		return nil, err
	}
	for _, n := range Names() {
		if !seen[n] {
			return nil, fmt.Errorf("queries: %s is missing", n)
		}
	}
	return out, nil
}

// MustParse is Parse for a backend's init.
func MustParse(src string) *Statements {
	s, err := Parse(src)
	if err != nil {
		panic(err)
	}
	return s
}

// Names are the statements' names, in field order.
func Names() []string {
	t := reflect.TypeOf(Statements{})
	out := make([]string, t.NumField())
	for i := range out {
		out[i] = t.Field(i).Name
	}
	return out
}

// ByName returns the statement called name, for tests.
func (s *Statements) ByName(name string) string {
	return reflect.ValueOf(s).Elem().FieldByName(name).String()
}
