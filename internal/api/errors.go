package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/fleetctl/fleetctl/internal/failpoint"
	"github.com/fleetctl/fleetctl/internal/opid"
	"github.com/fleetctl/fleetctl/internal/ops"
	"github.com/fleetctl/fleetctl/internal/store"
)

// APIError is an error with a stable code and an HTTP status.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

func apiErr(status int, code, msg string) *APIError { return &APIError{status, code, msg} }

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
		return apiErr(http.StatusRequestEntityTooLarge, "too_large", "request body exceeds 1 MiB")
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

func writeError(w http.ResponseWriter, log *slog.Logger, err error) {
	ae := toAPIError(err)
	if ae.Status >= 500 && ae.Code != "overloaded" {
		log.Error("request failed", "err", err)
	}
	if ae.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1") // every 503 is worth a retry with the same operation_id
	}
	writeJSON(w, ae.Status, Error{Code: ae.Code, Message: ae.Message})
}
