package fsm

import (
	"errors"
	"fmt"
)

// ErrIllegalTransition is returned for a move the table does not allow.
var ErrIllegalTransition = errors.New("illegal transition")

// TransitionError names the machine and the refused move.
type TransitionError struct {
	Machine  string
	From, To string
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("%s: illegal transition %s → %s", e.Machine, e.From, e.To)
}

func (e *TransitionError) Unwrap() error { return ErrIllegalTransition }

// Machine is one transition table over the string state type S.
type Machine[S ~string] struct {
	name   string
	states []S
	edges  map[S]map[S]struct{}
}

func newMachine[S ~string](name string, states []S, edges map[S][]S) *Machine[S] {
	m := &Machine[S]{name: name, states: states, edges: make(map[S]map[S]struct{}, len(edges))}
	for from, tos := range edges {
		set := make(map[S]struct{}, len(tos))
		for _, to := range tos {
			set[to] = struct{}{}
		}
		m.edges[from] = set
	}
	return m
}

// Name is the machine's name as it appears in metrics and events.
func (m *Machine[S]) Name() string { return m.name }

// States lists every state of the machine, in declaration order.
func (m *Machine[S]) States() []S { return append([]S(nil), m.states...) }

// Valid reports whether s is a state of this machine.
func (m *Machine[S]) Valid(s S) bool {
	for _, st := range m.states {
		if st == s {
			return true
		}
	}
	return false
}

// final reports whether no transition leaves s.
func (m *Machine[S]) final(s S) bool { return len(m.edges[s]) == 0 }

// Can reports whether from → to is in the table.
func (m *Machine[S]) Can(from, to S) bool {
	_, ok := m.edges[from][to]
	return ok
}

// Transition returns nil for a legal move and a *TransitionError
// (errors.Is ErrIllegalTransition) otherwise.
func (m *Machine[S]) Transition(from, to S) error {
	if m.Can(from, to) {
		return nil
	}
	return &TransitionError{Machine: m.name, From: string(from), To: string(to)}
}

// Sources lists the states from which to is reachable in one move, in
// declaration order: the set a conditional UPDATE names in its WHERE clause.
func (m *Machine[S]) Sources(to S) []S {
	var out []S
	for _, from := range m.states {
		if m.Can(from, to) {
			out = append(out, from)
		}
	}
	return out
}
