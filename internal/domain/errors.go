package domain

import (
	"errors"
	"fmt"
)

// Code is a stable error code of the contract: the "error" of every
// refused HTTP answer, an MCP tool error's code, a CLI's exit message.
// The API maps each to one HTTP status (api.toAPIError), in one place;
// the codes of the transport alone (unauthorized, forbidden_origin,
// invalid_json, ...) are the API's own.
type Code string

// The domain's codes.
const (
	// CodeInvalid: the request is malformed or breaks a rule of its own
	// fields (400 invalid_request).
	CodeInvalid Code = "invalid_request"
	// CodeInvalidPlan: a task's steps break a plan rule (400).
	CodeInvalidPlan Code = "invalid_plan"
	// CodeKeyMismatch: an Idempotency-Key differs from the body's
	// operation_id (400).
	CodeKeyMismatch Code = "idempotency_key_mismatch"
	// CodeDeviceUnknown: a device never seen (no birth yet) named where
	// one must be known (400 at a rollout's creation).
	CodeDeviceUnknown Code = "device_unknown"
	// CodeApprovalRequired: the action's policy needs an approved task (403).
	CodeApprovalRequired Code = "approval_required"
	// CodePermissionDenied: the principal holds no grant (403).
	CodePermissionDenied Code = "permission_denied"
	// CodeReservedOperationID: a direct submit of an id shape the
	// controller's runners own (403).
	CodeReservedOperationID Code = "reserved_operation_id"
	// CodeFourEyes: the approver wrote the version it approves (403).
	CodeFourEyes Code = "four_eyes"
	// CodeNotFound: no record has the id (404).
	CodeNotFound Code = "not_found"
	// CodeIllegalState: the record's state does not allow it (409).
	CodeIllegalState Code = "illegal_state"
	// CodeNotFinal: a compensation of an operation not yet final (409).
	CodeNotFinal Code = "not_final"
	// CodeStaleVersion: another version than the current one (409).
	CodeStaleVersion Code = "stale_version"
	// CodeAlreadyPublished: a cancel of a command already published (409).
	CodeAlreadyPublished Code = "already_published"
	// CodeKeyReused: the id exists with other content (422).
	CodeKeyReused Code = "idempotency_key_reused"
	// CodeTooLarge: the command would exceed its size limit (413).
	CodeTooLarge Code = "too_large"
	// CodeOverloaded: the write queue is full; retry after a while (503).
	CodeOverloaded Code = "overloaded"
)

// Codes are every domain code (the API maps each to a status; a test
// holds it to that).
var Codes = []Code{CodeInvalid, CodeInvalidPlan, CodeKeyMismatch, CodeDeviceUnknown, CodeApprovalRequired,
	CodePermissionDenied, CodeReservedOperationID, CodeFourEyes, CodeNotFound, CodeIllegalState, CodeNotFinal,
	CodeStaleVersion, CodeAlreadyPublished, CodeKeyReused, CodeTooLarge, CodeOverloaded}

// Error is a refusal with its code. Two Errors match under errors.Is when
// their codes are equal, so a wrapped, worded refusal still is its code's
// sentinel (errors.Is(err, ErrNotFound)).
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return e.Message
}

// Is reports whether target is an Error of the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Errorf is a refusal of code, worded.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode is err's code, or "" when err is no refusal.
func ErrorCode(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// The sentinels the store and the services wrap (fmt.Errorf("...: %w")).
var (
	ErrInvalid          = &Error{Code: CodeInvalid, Message: "invalid request"}
	ErrNotFound         = &Error{Code: CodeNotFound, Message: "not found"}
	ErrKeyReused        = &Error{Code: CodeKeyReused, Message: "idempotency key reused with other parameters"}
	ErrStaleVersion     = &Error{Code: CodeStaleVersion, Message: "stale version"}
	ErrFourEyes         = &Error{Code: CodeFourEyes, Message: "four eyes: the approver wrote this plan version"}
	ErrAlreadyPublished = &Error{Code: CodeAlreadyPublished, Message: "command already published"}
	ErrIllegalState     = &Error{Code: CodeIllegalState, Message: "illegal state"}
	ErrPermissionDenied = &Error{Code: CodePermissionDenied, Message: "permission denied"}
	ErrOverloaded       = &Error{Code: CodeOverloaded, Message: "store: write queue full, retry later"}
)
