package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/fleetctl/fleetctl/internal/apiwire"
	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/opid"
	"github.com/fleetctl/fleetctl/internal/ops"
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

// toAPIError maps every error to its HTTP form, in one place.
func toAPIError(err error) *APIError {
	var ae *APIError
	var oe *ops.Error
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &oe):
		return apiErr(kindStatus[oe.Kind], oe.Code, oe.Message)
	case errors.As(err, &mbe):
		return refusal(http.StatusRequestEntityTooLarge, "too_large", wire.ReasonTooLarge, "request body exceeds 1 MiB")
	case errors.Is(err, opid.ErrInvalid):
		return apiErr(http.StatusBadRequest, "invalid_request", err.Error())
	case errors.Is(err, store.ErrNotFound):
		return apiErr(http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, store.ErrKeyReused):
		return apiErr(http.StatusUnprocessableEntity, "idempotency_key_reused",
			"this operation_id exists with other action, target or params; use a new operation_id for a new intent")
	case errors.Is(err, store.ErrOverloaded):
		return apiErr(http.StatusServiceUnavailable, "overloaded", "the controller is saturated; retry with the same operation_id after Retry-After")
	case errors.Is(err, failpoint.ErrInjected):
		return apiErr(http.StatusServiceUnavailable, "unavailable", err.Error()+"; retry with the same operation_id")
	case errors.Is(err, store.ErrStaleVersion):
		return apiErr(http.StatusConflict, "stale_version", err.Error())
	case errors.Is(err, store.ErrFourEyes):
		return apiErr(http.StatusForbidden, "four_eyes", err.Error())
	case errors.Is(err, store.ErrAlreadyPublished):
		return apiErr(http.StatusConflict, "already_published", err.Error())
	case errors.Is(err, store.ErrIllegalState):
		return apiErr(http.StatusConflict, "illegal_state", err.Error())
	case errors.Is(err, store.ErrRefused):
		return apiErr(http.StatusConflict, "illegal_state", err.Error())
	}
	return apiErr(http.StatusServiceUnavailable, "unavailable", "the store did not answer; retry with the same operation_id")
}

// kindStatus maps each kind of domain refusal to its HTTP status.
var kindStatus = map[ops.Kind]int{
	ops.KindInvalid:   http.StatusBadRequest,
	ops.KindForbidden: http.StatusForbidden,
	ops.KindConflict:  http.StatusConflict,
	ops.KindTooLarge:  http.StatusRequestEntityTooLarge,
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
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
