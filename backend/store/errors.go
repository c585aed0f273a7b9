package store

import (
	"errors"
	"fmt"
)

// ErrNotFound reports that a domain, version or other named thing does not
// exist.
var ErrNotFound = errors.New("not found")

// ErrConflict reports that a change was based on a version that is no longer
// the current one, or that the current state forbids it.
var ErrConflict = errors.New("conflict")

// ConflictError reports that a domain (or, with an empty Domain, the
// ruleset) changed after the author's base version.
type ConflictError struct {
	Domain    string
	Base      int64
	ChangedIn int64
}

func (e *ConflictError) Error() string {
	if e.Domain == "" {
		return fmt.Sprintf("the ruleset changed in version %d, after base version %d", e.ChangedIn, e.Base)
	}
	return fmt.Sprintf("domain %q changed in version %d, after base version %d", e.Domain, e.ChangedIn, e.Base)
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// InvalidError reports a request that can never succeed as given; its
// message is safe to show.
type InvalidError struct{ Reason string }

func (e *InvalidError) Error() string { return e.Reason }

// RefusedError reports a request that the current state forbids (disabling
// the last admin, approving a decided change); its message is safe to show.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *RefusedError) Unwrap() error { return ErrConflict }
