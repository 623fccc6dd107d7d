package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/domain"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/store"
	"github.com/fleetctl/fleetctl/internal/wire"
)

// APIError is an error with a stable code and an HTTP status. Reason, when
// set, is the reason label it is counted under as an input refused.
type APIError struct {
	Status  int
	Code    string
	Message string
	Reason  string
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

func apiErr(status int, code, msg string) *APIError {
	return &APIError{Status: status, Code: code, Message: msg}
}

// toAPIError maps every error to its HTTP form, in one place: the
// transport's own refusals (APIError) as they are, the domain's by their
// code (codeStatus).
func toAPIError(err error) *APIError {
	var ae *APIError
	var de *domain.Error
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &mbe):
		return refusal(http.StatusRequestEntityTooLarge, "too_large", wire.ReasonTooLarge, "request body exceeds 1 MiB")
	case errors.Is(err, failpoint.ErrInjected):
		return apiErr(http.StatusServiceUnavailable, "unavailable", err.Error()+"; retry with the same operation_id")
	case errors.Is(err, store.ErrRefused):
		return apiErr(http.StatusConflict, string(domain.CodeIllegalState), err.Error())
	case errors.As(err, &de):
		status, ok := codeStatus[de.Code]
		if !ok {
			break
		}
		msg := de.Message // a worded refusal (domain.Errorf) says it all
		switch {
		case de.Code == domain.CodeKeyReused:
			msg = "this operation_id exists with other action, target or params; use a new operation_id for a new intent"
		case de.Code == domain.CodeOverloaded:
			msg = "the controller is saturated; retry with the same operation_id after Retry-After"
		case sentinels[de]:
			msg = err.Error() // a sentinel says it with the context it was wrapped in
		}
		return apiErr(status, string(de.Code), msg)
	}
	return apiErr(http.StatusServiceUnavailable, "unavailable", "the store did not answer; retry with the same operation_id")
}

// sentinels are the domain's bare refusals, worded by their wrapping.
var sentinels = map[*domain.Error]bool{domain.ErrInvalid: true, domain.ErrNotFound: true, domain.ErrKeyReused: true,
	domain.ErrStaleVersion: true, domain.ErrFourEyes: true, domain.ErrAlreadyPublished: true, domain.ErrIllegalState: true,
	domain.ErrPermissionDenied: true, domain.ErrOverloaded: true}

// codeStatus is the HTTP status of each domain code.
var codeStatus = map[domain.Code]int{
	domain.CodeInvalid:             http.StatusBadRequest,
	domain.CodeInvalidPlan:         http.StatusBadRequest,
	domain.CodeKeyMismatch:         http.StatusBadRequest,
	domain.CodeDeviceUnknown:       http.StatusBadRequest,
	domain.CodeApprovalRequired:    http.StatusForbidden,
	domain.CodePermissionDenied:    http.StatusForbidden,
	domain.CodeReservedOperationID: http.StatusForbidden,
	domain.CodeFourEyes:            http.StatusForbidden,
	domain.CodeNotFound:            http.StatusNotFound,
	domain.CodeIllegalState:        http.StatusConflict,
	domain.CodeNotFinal:            http.StatusConflict,
	domain.CodeStaleVersion:        http.StatusConflict,
	domain.CodeAlreadyPublished:    http.StatusConflict,
	domain.CodeKeyReused:           http.StatusUnprocessableEntity,
	domain.CodeTooLarge:            http.StatusRequestEntityTooLarge,
	domain.CodeOverloaded:          http.StatusServiceUnavailable,
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if a, ok := v.(jsonAppender); ok {
		// An operation or a page of them: the same bytes as below, written
		// by hand (apiwire.Operation.AppendJSON).
		if b, err := a.AppendJSON(make([]byte, 0, 1024)); err == nil {
			_, _ = w.Write(append(b, '\n'))
		}
		return
	}
	_ = json.NewEncoder(w).Encode(v) // compact: indenting cost as much as encoding
}

// jsonAppender appends its JSON as json.Marshal writes it.
type jsonAppender interface {
	AppendJSON(b []byte) ([]byte, error)
}

// refusedReason is the reason an answer counts under as an input refused,
// or "" for one that is not: any 400, 413, 415 or 421, and the browser
// rules' 403. A 400 without a reason of its own is invalid_value.
func refusedReason(ae *APIError) string {
	if ae.Reason != "" {
		return ae.Reason
	}
	switch ae.Status {
	case http.StatusBadRequest:
		if ae.Code == "invalid_json" {
			return wire.ReasonInvalidJSON
		}
		return wire.ReasonInvalidValue
	case http.StatusRequestEntityTooLarge:
		return wire.ReasonTooLarge
	}
	return ""
}

// writeError writes err's answer, the one place that does; it counts the
// refused inputs.
func (s *Server) writeError(w http.ResponseWriter, err error) {
	ae := toAPIError(err)
	if reason := refusedReason(ae); reason != "" && s.cfg.Refused != nil {
		s.cfg.Refused(reason)
	}
	if ae.Status >= 500 && ae.Code != "overloaded" {
		s.cfg.Logger.Error("request failed", "err", err)
	}
	if ae.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1") // every 503 is worth a retry with the same operation_id
	}
	writeJSON(w, ae.Status, apiwire.Error{Code: ae.Code, Message: ae.Message})
}
