// Package domain is the controller's vocabulary, at the centre of the
// house: the records (an operation, a command with its receipts and
// events, a device, a task with its plan and approval, a rollout, a
// grant, an instance), the operation-id formats with their reserved rules
// and the request hash (opid.go), and the error codes with their sentinels
// (errors.go). It imports no store, no transport and no driver: the store
// reads and writes these records and maps its drivers' errors into these
// codes at its edge; the API maps each code to one HTTP status; the CLI,
// the MCP server and the services speak the same words.
//
// Operation ids. An operation_id defaults to
// task_id:step:target:business_version (DeriveOperationID), each part
// [A-Za-z0-9._-]{1,64}; a caller may give the whole id instead
// ([A-Za-z0-9._:-]{1,200}, ValidateOperationID). Three shapes belong to
// the controller's own runners and are refused at a direct submit (403
// reserved_operation_id): a task step's,
// {task_id}:{step}:{target}:approval-v<N> (TaskStepOperationID,
// TaskStepShaped); a rollout device's, {rollout_id}:rollout:{device}:v<N>
// (RolloutOperationID, RolloutShaped); a compensation's,
// {original}:compensate:{business_version} (CompensationOperationID,
// CompensationShaped), made only by POST .../compensations.
package domain
