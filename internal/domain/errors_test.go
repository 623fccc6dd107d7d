package domain

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A refusal is its code's sentinel however it is worded or wrapped, and
// no other code's.
func TestErrorsMatchByCode(t *testing.T) {
	t.Parallel()
	worded := Errorf(CodeNotFound, "operation %s", "op-1")
	wrapped := fmt.Errorf("get operation: %w", ErrNotFound)
	for _, err := range []error{worded, wrapped, fmt.Errorf("outer: %w", worded)} {
		require.ErrorIs(t, err, ErrNotFound)
		require.NotErrorIs(t, err, ErrIllegalState)
		require.Equal(t, CodeNotFound, ErrorCode(err))
	}
	require.Equal(t, "operation op-1", worded.Error())
	require.Equal(t, "get operation: not found", wrapped.Error())
	require.Equal(t, Code(""), ErrorCode(errors.New("disk full")))
	require.NotErrorIs(t, errors.New("not found"), ErrNotFound)
}

// Every code is listed once, and each sentinel's code is listed.
func TestCodesAreListedOnce(t *testing.T) {
	t.Parallel()
	seen := map[Code]bool{}
	for _, c := range Codes {
		require.False(t, seen[c], c)
		seen[c] = true
	}
	for _, e := range []*Error{ErrInvalid, ErrNotFound, ErrKeyReused, ErrStaleVersion, ErrFourEyes, ErrAlreadyPublished,
		ErrIllegalState, ErrPermissionDenied, ErrOverloaded} {
		require.True(t, seen[e.Code], e.Code)
	}
}
