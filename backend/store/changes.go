package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Change request statuses.
const (
	ChangePending  = "pending"
	ChangeApproved = "approved"
	ChangeRejected = "rejected"
)

// ErrSelfApproval is returned when the author of a change request (or a
// token they created) tries to approve it.
var ErrSelfApproval = errors.New("a change cannot be approved by its author")

// ChangeRequest is a publish waiting for (or decided by) a second person.
// Its content is resolved when proposed: approving publishes exactly what
// the reviewer saw, or fails with a *ConflictError if the base moved.
type ChangeRequest struct {
	ID          int64      `json:"id"`
	CreatedAt   time.Time  `json:"created_at"`
	Author      string     `json:"author"`
	Kind        ChangeKind `json:"kind"`
	Domain      string     `json:"domain,omitempty"`
	YAML        string     `json:"yaml,omitempty"`
	Deleted     bool       `json:"deleted,omitempty"` // the change removes the domain
	BaseVersion int64      `json:"base_version"`
	RollbackOf  *int64     `json:"rollback_of,omitempty"`
	Message     string     `json:"message"`
	Status      string     `json:"status"`
	Reviewer    string     `json:"reviewer,omitempty"`
	ReviewedAt  *time.Time `json:"reviewed_at,omitempty"`
	// ReviewMessage is the approver's note or the rejection's reason.
	ReviewMessage string `json:"review_message,omitempty"`
	Version       *int64 `json:"version,omitempty"` // published version, once approved
	// Edits are the domains a change of kind ruleset sets or removes.
	Edits []DomainEdit `json:"edits,omitempty"`
	// Override is what a change of kind override publishes.
	Override *OverrideSpec `json:"override,omitempty"`
}

type changeRow struct {
	ID            int64 `gorm:"primaryKey"`
	CreatedAt     time.Time
	Author        string
	AuthorOwner   string
	Kind          string
	Domain        string
	YAML          string `gorm:"column:yaml"`
	Deleted       bool
	Edits         []DomainEdit  `gorm:"serializer:json"` // NULL unless kind is ruleset
	Override      *OverrideSpec `gorm:"serializer:json"` // NULL unless kind is override
	BaseVersion   int64
	RollbackOf    *int64
	Message       string
	Status        string
	Reviewer      string
	ReviewedAt    *time.Time
	ReviewMessage string
	Version       *int64
}

func (changeRow) TableName() string { return "change_requests" }

func (r changeRow) change() ChangeRequest {
	return ChangeRequest{ID: r.ID, CreatedAt: r.CreatedAt, Author: r.Author, Kind: ChangeKind(r.Kind), Domain: r.Domain,
		YAML: r.YAML, Deleted: r.Deleted, Edits: r.Edits, BaseVersion: r.BaseVersion, RollbackOf: r.RollbackOf, Message: r.Message,
		Status: r.Status, Reviewer: r.Reviewer, ReviewedAt: r.ReviewedAt, ReviewMessage: r.ReviewMessage, Version: r.Version,
		Override: r.Override}
}

func (r changeRow) plan() plan {
	return plan{kind: ChangeKind(r.Kind), domain: r.Domain, yaml: r.YAML, deleted: r.Deleted,
		base: r.BaseVersion, checkBase: r.Kind != string(KindOverride), rollbackOf: r.RollbackOf, edits: r.Edits, override: r.Override}
}

// Propose records c as a pending change request, with its audit event. It
// fails as Publish would if c cannot apply to the current ruleset (stale
// base, unknown domain or version). BreakGlass is ignored.
func (s *Store) Propose(ctx context.Context, c Change) (ChangeRequest, error) {
	if c.Rollout != nil {
		// A change request does not carry a rollout (yet): approving it
		// would send it to every node, which is not what was asked.
		return ChangeRequest{}, &InvalidError{Reason: "a staged rollout cannot wait for approval: publish it staged with break_glass_reason (admins), or propose it without rollout"}
	}
	if c.Kind == KindOverrideEnd {
		return ChangeRequest{}, &InvalidError{Reason: "ending an override needs no approval: end it"}
	}
	var row changeRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		head, err := headVersion(tx)
		if err != nil {
			return err
		}
		p, err := resolve(tx, c, head)
		if err != nil {
			return err
		}
		row = changeRow{CreatedAt: time.Now().UTC(), Author: c.Actor.Name, AuthorOwner: c.Actor.owner(), Kind: string(p.kind),
			Domain: p.domain, YAML: p.yaml, Deleted: p.deleted, Edits: p.edits, BaseVersion: p.base, RollbackOf: p.rollbackOf,
			Message: c.Message, Status: ChangePending, Override: p.override}
		if err := tx.Create(&row).Error; err != nil {
			return fmt.Errorf("write change request: %w", err)
		}
		after := map[string]any{"change_id": row.ID, "kind": row.Kind, "base_version": row.BaseVersion, "deleted": row.Deleted}
		if row.RollbackOf != nil {
			after["rollback_of"] = *row.RollbackOf
		}
		switch {
		case row.Kind == string(KindRuleset):
			after["edits"] = row.Edits
		case row.Kind == string(KindOverride):
			after["override"] = row.Override
		case !row.Deleted && row.Kind != string(KindRollback):
			after["yaml"] = row.YAML
		}
		return appendAudit(tx, c.Actor, "change.propose", changeTarget(p), c.Message, nil, after)
	})
	if err != nil {
		return ChangeRequest{}, fmt.Errorf("propose %s: %w", describeChange(c), err)
	}
	return row.change(), nil
}

// lockPending reads change request id for update and checks it is pending.
func lockPending(tx *gorm.DB, id int64) (changeRow, error) {
	var row changeRow
	if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", id).Take(&row).Error; err != nil {
		return row, notFound(err, fmt.Sprintf("change request %d", id))
	}
	if row.Status != ChangePending {
		return row, &RefusedError{Reason: fmt.Sprintf("change request %d is already %s", id, row.Status)}
	}
	return row, nil
}

// Approve publishes pending change request id as a new version, authored by
// its author and approved by reviewer, in one transaction with the audit
// events. It returns ErrSelfApproval when reviewer (or the owner of
// reviewer's token) is the author, and a *ConflictError when the domain or
// ruleset changed after the request's base; the request then stays pending.
func (s *Store) Approve(ctx context.Context, id int64, reviewer Actor, message string) (ChangeRequest, error) {
	var row changeRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if row, err = lockPending(tx, id); err != nil {
			return err
		}
		if reviewer.Name == row.Author || reviewer.owner() == row.AuthorOwner {
			return ErrSelfApproval
		}
		v, err := nextVersion(tx)
		if err != nil {
			return err
		}
		p := row.plan()
		if err := check(tx, p, v-1); err != nil {
			return err
		}
		approver := reviewer.Name
		meta := versionMeta{author: row.Author, message: row.Message, approvedBy: &approver, changeID: &row.ID}
		if err := apply(tx, p, v, meta, reviewer); err != nil {
			return err
		}
		now := time.Now().UTC()
		row.Status, row.Reviewer, row.ReviewedAt, row.ReviewMessage, row.Version = ChangeApproved, reviewer.Name, &now, message, &v
		if err := saveReview(tx, row); err != nil {
			return err
		}
		return appendAudit(tx, reviewer, "change.approve", changeTarget(p), message,
			map[string]any{"change_id": row.ID, "status": ChangePending},
			map[string]any{"change_id": row.ID, "status": ChangeApproved, "version": v, "author": row.Author})
	})
	if err != nil {
		return ChangeRequest{}, fmt.Errorf("approve change request %d: %w", id, err)
	}
	return row.change(), nil
}

// Reject closes pending change request id without publishing. Anyone who
// may approve may reject, and so may the author (to withdraw it).
func (s *Store) Reject(ctx context.Context, id int64, reviewer Actor, message string) (ChangeRequest, error) {
	var row changeRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		var err error
		if row, err = lockPending(tx, id); err != nil {
			return err
		}
		now := time.Now().UTC()
		row.Status, row.Reviewer, row.ReviewedAt, row.ReviewMessage = ChangeRejected, reviewer.Name, &now, message
		if err := saveReview(tx, row); err != nil {
			return err
		}
		return appendAudit(tx, reviewer, "change.reject", changeTarget(row.plan()), message,
			map[string]any{"change_id": row.ID, "status": ChangePending},
			map[string]any{"change_id": row.ID, "status": ChangeRejected, "author": row.Author})
	})
	if err != nil {
		return ChangeRequest{}, fmt.Errorf("reject change request %d: %w", id, err)
	}
	return row.change(), nil
}

func saveReview(tx *gorm.DB, row changeRow) error {
	err := tx.Model(&changeRow{}).Where("id = ?", row.ID).Updates(map[string]any{
		"status": row.Status, "reviewer": row.Reviewer, "reviewed_at": row.ReviewedAt,
		"review_message": row.ReviewMessage, "version": row.Version,
	}).Error
	if err != nil {
		return fmt.Errorf("record review: %w", err)
	}
	return nil
}

// FindChange returns one change request.
func (s *Store) FindChange(ctx context.Context, id int64) (ChangeRequest, error) {
	var row changeRow
	if err := s.db.WithContext(ctx).Where("id = ?", id).Take(&row).Error; err != nil {
		return ChangeRequest{}, notFound(err, fmt.Sprintf("change request %d", id))
	}
	return row.change(), nil
}

// ChangeFilter narrows ListChanges. Zero fields do not filter.
type ChangeFilter struct {
	Status string
	Domain string
	Author string
	Before int64 // cursor: only requests with ID < Before
	Limit  int   // page size, 1..1000 (default 100)
}

// ListChanges returns a page of change requests, newest first, and the
// cursor of the next page (0 when this is the last).
func (s *Store) ListChanges(ctx context.Context, f ChangeFilter) ([]ChangeRequest, int64, error) {
	q := s.db.WithContext(ctx).Order("id DESC")
	if f.Status != "" {
		q = q.Where("status = ?", f.Status)
	}
	if f.Domain != "" {
		touches, err := json.Marshal([]DomainEdit{{Domain: f.Domain}})
		if err != nil {
			return nil, 0, fmt.Errorf("list change requests: %w", err)
		}
		q = q.Where("(domain = ? OR edits @> ?::jsonb)", f.Domain, string(touches))
	}
	if f.Author != "" {
		q = q.Where("author = ?", f.Author)
	}
	if f.Before > 0 {
		q = q.Where("id < ?", f.Before)
	}
	limit := pageSize(f.Limit)
	var rows []changeRow
	if err := q.Limit(limit + 1).Find(&rows).Error; err != nil {
		return nil, 0, fmt.Errorf("list change requests: %w", err)
	}
	var next int64
	if len(rows) > limit {
		rows = rows[:limit]
		next = rows[limit-1].ID
	}
	out := make([]ChangeRequest, len(rows))
	for i, r := range rows {
		out[i] = r.change()
	}
	return out, next, nil
}
