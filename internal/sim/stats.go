package sim

// Stats are a device's counters (or, from Fleet.Stats, the sum over the
// fleet). They are the simulator's observations and survive a simulated
// crash; they start at zero with the process.
type Stats struct {
	// CommandsSeen counts command messages delivered to the device,
	// repeats and dropped ones included.
	CommandsSeen int64 `json:"commands_seen"`
	// CommandsDropped counts commands lost by the drop_command fault.
	CommandsDropped int64 `json:"commands_dropped"`
	// DuplicatesSuppressed counts repeats of a command_id, and later
	// commands of an operation already taken, answered without executing.
	DuplicatesSuppressed int64 `json:"duplicates_suppressed"`
	// Executions counts real executions (lines in executions.jsonl).
	Executions int64 `json:"executions"`
	Succeeded  int64 `json:"succeeded"`
	Failed     int64 `json:"failed"`
	// Rejected counts rejected commands, Expired those rejected as expired.
	Rejected int64 `json:"rejected"`
	Expired  int64 `json:"expired"`
	// ReceiptsPublished counts receipts the broker acknowledged;
	// FinalReceiptsPublished the final ones among them (lines in
	// receipts.jsonl).
	ReceiptsPublished      int64 `json:"receipts_published"`
	FinalReceiptsPublished int64 `json:"final_receipts_published"`
	ReceiptsDropped        int64 `json:"receipts_dropped"`
	ReceiptsDuplicated     int64 `json:"receipts_duplicated"`
	ReceiptsDelayed        int64 `json:"receipts_delayed"`
	ReceiptsReordered      int64 `json:"receipts_reordered"`
	QueriesSeen            int64 `json:"queries_seen"`
	QueriesAnswered        int64 `json:"queries_answered"`
	QueriesIgnored         int64 `json:"queries_ignored"`
	// Connects counts connections that completed (subscribed, birth
	// published); ConnectionDrops abrupt disconnects by fault or by
	// DropConnection; Crashes simulated crashes; Boots device starts.
	Connects        int64 `json:"connects"`
	ConnectionDrops int64 `json:"connection_drops"`
	Crashes         int64 `json:"crashes"`
	Boots           int64 `json:"boots"`
	// Recovered counts commands found "executing" at boot and resolved.
	Recovered int64 `json:"recovered"`
}

func (s *Stats) add(o Stats) {
	s.CommandsSeen += o.CommandsSeen
	s.CommandsDropped += o.CommandsDropped
	s.DuplicatesSuppressed += o.DuplicatesSuppressed
	s.Executions += o.Executions
	s.Succeeded += o.Succeeded
	s.Failed += o.Failed
	s.Rejected += o.Rejected
	s.Expired += o.Expired
	s.ReceiptsPublished += o.ReceiptsPublished
	s.FinalReceiptsPublished += o.FinalReceiptsPublished
	s.ReceiptsDropped += o.ReceiptsDropped
	s.ReceiptsDuplicated += o.ReceiptsDuplicated
	s.ReceiptsDelayed += o.ReceiptsDelayed
	s.ReceiptsReordered += o.ReceiptsReordered
	s.QueriesSeen += o.QueriesSeen
	s.QueriesAnswered += o.QueriesAnswered
	s.QueriesIgnored += o.QueriesIgnored
	s.Connects += o.Connects
	s.ConnectionDrops += o.ConnectionDrops
	s.Crashes += o.Crashes
	s.Boots += o.Boots
	s.Recovered += o.Recovered
}
