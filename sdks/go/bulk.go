package composer

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// BulkOperationKind is what a bulk operation does to each run.
type BulkOperationKind int32

// The kinds of composer.v1.BulkOperationKind.
const (
	BulkKindUnspecified BulkOperationKind = BulkOperationKind(pb.BulkOperationKind_BULK_OPERATION_KIND_UNSPECIFIED)
	// BulkKindCancel: CancelRun on each run (BulkCancelRuns).
	BulkKindCancel BulkOperationKind = BulkOperationKind(pb.BulkOperationKind_BULK_OPERATION_KIND_CANCEL)
	// BulkKindRetry: RetryRun on each run (BulkRetryRuns).
	BulkKindRetry BulkOperationKind = BulkOperationKind(pb.BulkOperationKind_BULK_OPERATION_KIND_RETRY)
	// BulkKindPause: PauseRun on each run (BulkPauseRuns).
	BulkKindPause BulkOperationKind = BulkOperationKind(pb.BulkOperationKind_BULK_OPERATION_KIND_PAUSE)
	// BulkKindResume: ResumeRun on each run (BulkResumeRuns).
	BulkKindResume BulkOperationKind = BulkOperationKind(pb.BulkOperationKind_BULK_OPERATION_KIND_RESUME)
	// BulkKindMigrate: moves each run in flight to another version of its
	// workflow (MigrateRuns).
	BulkKindMigrate BulkOperationKind = BulkOperationKind(pb.BulkOperationKind_BULK_OPERATION_KIND_MIGRATE)
)

// String is the kind's name without its prefix, e.g. RETRY.
func (k BulkOperationKind) String() string {
	return strings.TrimPrefix(pb.BulkOperationKind(k).String(), "BULK_OPERATION_KIND_")
}

// BulkOperationStatus is where a bulk operation is in its life.
type BulkOperationStatus int32

// The statuses of composer.v1.BulkOperationStatus.
const (
	BulkStatusUnspecified BulkOperationStatus = BulkOperationStatus(pb.BulkOperationStatus_BULK_OPERATION_STATUS_UNSPECIFIED)
	// BulkPending: created; no server has taken it yet.
	BulkPending BulkOperationStatus = BulkOperationStatus(pb.BulkOperationStatus_BULK_OPERATION_STATUS_PENDING)
	// BulkRunning: a server is working through its runs, a batch at a time.
	BulkRunning BulkOperationStatus = BulkOperationStatus(pb.BulkOperationStatus_BULK_OPERATION_STATUS_RUNNING)
	// BulkSucceeded: every matching run was acted on or skipped.
	BulkSucceeded BulkOperationStatus = BulkOperationStatus(pb.BulkOperationStatus_BULK_OPERATION_STATUS_SUCCEEDED)
	// BulkCancelled: CancelBulkOperation stopped it.
	BulkCancelled BulkOperationStatus = BulkOperationStatus(pb.BulkOperationStatus_BULK_OPERATION_STATUS_CANCELLED)
	// BulkFailed: it stopped on an error it could not get past (BulkOperation.Error).
	BulkFailed BulkOperationStatus = BulkOperationStatus(pb.BulkOperationStatus_BULK_OPERATION_STATUS_FAILED)
)

// String is the status's name without its prefix, e.g. SUCCEEDED.
func (s BulkOperationStatus) String() string {
	return strings.TrimPrefix(pb.BulkOperationStatus(s).String(), "BULK_OPERATION_STATUS_")
}

// IsFinal reports whether the operation ended (SUCCEEDED, CANCELLED or FAILED).
func (s BulkOperationStatus) IsFinal() bool {
	return s == BulkSucceeded || s == BulkCancelled || s == BulkFailed
}

// BulkOperationFailure is one run a bulk operation could not act on.
type BulkOperationFailure struct {
	RunID   string
	Message string
}

// BulkOperation is a long-running action over the runs a filter matches.
// Any server works on it, a batch at a time, and another takes over if that
// server stops. Counts only grow; once it ends, Matched = Succeeded +
// Skipped + Failed unless it was cancelled.
type BulkOperation struct {
	ID        string
	Namespace string
	Kind      BulkOperationKind
	Status    BulkOperationStatus
	// Filter is the filter it was started with (PageSize is 0).
	Filter RunFilter
	// Reason is the reason given, for cancel and pause.
	Reason string
	// Matched counts the runs that matched when it started (only runs
	// created before it match).
	Matched int64
	// Succeeded counts the runs acted on.
	Succeeded int64
	// Skipped counts the runs passed over because they were no longer in a
	// status the action applies to (a run that ended before a cancel
	// reached it, a run that was not FAILED when a retry reached it, a run
	// already on a migration's target version).
	Skipped int64
	// Failed counts the runs the action failed on; Failures holds the first
	// (up to 20) with why (for a migration, an incompatible run's
	// divergence).
	Failed   int64
	Failures []BulkOperationFailure
	// CreatedBy is the subject of the token that started it.
	CreatedBy  string
	CreateTime time.Time
	// UpdateTime is when it last made progress.
	UpdateTime time.Time
	// EndTime is when it ended; zero while it runs.
	EndTime time.Time
	// Error says why it FAILED.
	Error string
	// TargetVersion is, for a migration, the version runs are moved to.
	TargetVersion int
	// NodeMapping is, for a migration, the node ids renamed in the target:
	// recorded id to new id.
	NodeMapping map[string]string
	// Created is set by the Bulk*Runs calls: false when WithRequestID
	// matched an operation started before.
	Created bool
}

type bulkOptions struct {
	all       bool
	requestID string
}

// BulkOption configures BulkCancelRuns, BulkRetryRuns, BulkPauseRuns and
// BulkResumeRuns.
type BulkOption func(*bulkOptions)

// WithAllRuns lets an empty filter select every run of the namespace;
// without it an empty filter is refused (FAILED_PRECONDITION), so a
// forgotten filter never sweeps the whole namespace.
func WithAllRuns() BulkOption { return func(o *bulkOptions) { o.all = true } }

// WithRequestID makes a repeated call with the same id return the operation
// the first call started (BulkOperation.Created false) and start nothing.
func WithRequestID(id string) BulkOption { return func(o *bulkOptions) { o.requestID = id } }

func bulkOptionsOf(opts []BulkOption) bulkOptions {
	var o bulkOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// proto is the filter as a bulk request's RunFilter (PageSize is ListRuns').
func (f RunFilter) proto() *pb.RunFilter {
	out := &pb.RunFilter{
		WorkflowName: f.Workflow, WorkflowVersion: int32(f.WorkflowVersion), Labels: f.Labels,
		ParentRunId: f.ParentRunID, Search: f.Search,
	}
	for _, s := range f.Statuses {
		out.Statuses = append(out.Statuses, pb.RunStatus(s))
	}
	if !f.CreatedAfter.IsZero() {
		out.CreateTimeAfter = timestamppb.New(f.CreatedAfter)
	}
	if !f.CreatedBefore.IsZero() {
		out.CreateTimeBefore = timestamppb.New(f.CreatedBefore)
	}
	return out
}

func runFilterFrom(f *pb.RunFilter) RunFilter {
	out := RunFilter{
		Workflow: f.GetWorkflowName(), WorkflowVersion: int(f.GetWorkflowVersion()), Labels: f.GetLabels(),
		CreatedAfter: toTime(f.GetCreateTimeAfter()), CreatedBefore: toTime(f.GetCreateTimeBefore()),
		ParentRunID: f.GetParentRunId(), Search: f.GetSearch(),
	}
	for _, s := range f.GetStatuses() {
		out.Statuses = append(out.Statuses, RunStatus(s))
	}
	return out
}

func bulkOperationFrom(op *pb.BulkOperation, created bool) *BulkOperation {
	if op == nil {
		return nil
	}
	out := &BulkOperation{
		ID: op.GetOperationId(), Namespace: op.GetNamespace(), Kind: BulkOperationKind(op.GetKind()),
		Status: BulkOperationStatus(op.GetStatus()), Filter: runFilterFrom(op.GetFilter()), Reason: op.GetReason(),
		Matched: op.GetMatched(), Succeeded: op.GetSucceeded(), Skipped: op.GetSkipped(), Failed: op.GetFailed(),
		CreatedBy: op.GetCreatedBy(), CreateTime: toTime(op.GetCreateTime()), UpdateTime: toTime(op.GetUpdateTime()),
		EndTime: toTime(op.GetEndTime()), Error: op.GetError(), TargetVersion: int(op.GetTargetVersion()),
		NodeMapping: op.GetNodeMapping(), Created: created,
	}
	for _, f := range op.GetFailures() {
		out.Failures = append(out.Failures, BulkOperationFailure{RunID: f.GetRunId(), Message: f.GetMessage()})
	}
	return out
}

// listedBulkOperationFrom is an operation as a listing gives it.
func listedBulkOperationFrom(op *pb.BulkOperation) *BulkOperation {
	return bulkOperationFrom(op, false)
}

// BulkCancelRuns starts an operation that cancels every run filter matches,
// as CancelRun would with reason, each run in its own transaction; runs that
// ended before their turn count as skipped. Only runs created before the
// operation match. The filter is checked as ListRuns checks it
// (INVALID_ARGUMENT naming filter.<field>); an empty one is
// FAILED_PRECONDITION unless WithAllRuns is given. The operation comes back
// PENDING or RUNNING: WaitBulkOperation waits for its end.
func (c *Client) BulkCancelRuns(ctx context.Context, filter RunFilter, reason string, opts ...BulkOption) (*BulkOperation, error) {
	o := bulkOptionsOf(opts)
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.BulkCancelRuns(ctx, &pb.BulkCancelRunsRequest{
		Filter: filter.proto(), All: o.all, Reason: reason, RequestId: o.requestID,
	}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return bulkOperationFrom(r.GetOperation(), r.GetCreated()), nil
}

// BulkRetryRuns starts an operation that retries every FAILED run filter
// matches, as RetryRun would; a run that is not FAILED when its turn comes
// counts as skipped. Filter and options as BulkCancelRuns.
func (c *Client) BulkRetryRuns(ctx context.Context, filter RunFilter, opts ...BulkOption) (*BulkOperation, error) {
	o := bulkOptionsOf(opts)
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.BulkRetryRuns(ctx, &pb.BulkRetryRunsRequest{
		Filter: filter.proto(), All: o.all, RequestId: o.requestID,
	}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return bulkOperationFrom(r.GetOperation(), r.GetCreated()), nil
}

// BulkPauseRuns starts an operation that pauses every live run filter
// matches, as PauseRun would with reason. Filter and options as
// BulkCancelRuns.
func (c *Client) BulkPauseRuns(ctx context.Context, filter RunFilter, reason string, opts ...BulkOption) (*BulkOperation, error) {
	o := bulkOptionsOf(opts)
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.BulkPauseRuns(ctx, &pb.BulkPauseRunsRequest{
		Filter: filter.proto(), All: o.all, Reason: reason, RequestId: o.requestID,
	}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return bulkOperationFrom(r.GetOperation(), r.GetCreated()), nil
}

// BulkResumeRuns starts an operation that resumes every PAUSED run filter
// matches, as ResumeRun would. Filter and options as BulkCancelRuns.
func (c *Client) BulkResumeRuns(ctx context.Context, filter RunFilter, opts ...BulkOption) (*BulkOperation, error) {
	o := bulkOptionsOf(opts)
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.BulkResumeRuns(ctx, &pb.BulkResumeRunsRequest{
		Filter: filter.proto(), All: o.all, RequestId: o.requestID,
	}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return bulkOperationFrom(r.GetOperation(), r.GetCreated()), nil
}

// MigrateRuns starts an operation that moves every run in flight (RUNNING
// or PAUSED) of filter.Workflow matching filter to targetVersion, a
// registered version of that workflow (docs/versions.md). Each run is
// replayed against the target (as ReplayRun would) and moved only when it
// is IDENTICAL or COMPATIBLE: it records run_migrated in its history and
// goes on under the target, leased tasks keeping their leases. An
// INCOMPATIBLE run stays where it is and counts as failed, its divergence
// in Failures; a run already on the target, ended or compensating counts
// as skipped. nodeMapping names the nodes renamed in the target, recorded
// id to new id (nil: none). WithRequestID works as for BulkCancelRuns;
// WithAllRuns does not apply (the filter names the workflow). A filter
// without Workflow or a targetVersion below 1 is INVALID_ARGUMENT before
// any call; the server checks the rest (an unknown version is
// INVALID_ARGUMENT naming target_version). WaitBulkOperation waits for
// the operation's end.
func (c *Client) MigrateRuns(ctx context.Context, filter RunFilter, targetVersion int, nodeMapping map[string]string, opts ...BulkOption) (*BulkOperation, error) {
	o := bulkOptionsOf(opts)
	switch {
	case filter.Workflow == "":
		return nil, invalidArgument("filter.workflow_name", "name the workflow whose runs to move")
	case targetVersion < 1:
		return nil, invalidArgument("target_version", "must be a registered version (1 or more)")
	case o.all:
		return nil, invalidArgument("all", "MigrateRuns moves the runs of filter.Workflow: WithAllRuns does not apply")
	}
	if err := checkNodeMapping(nodeMapping); err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.MigrateRuns(ctx, &pb.MigrateRunsRequest{
		Filter: filter.proto(), TargetVersion: int32(targetVersion), NodeMapping: nodeMapping, RequestId: o.requestID,
	}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return bulkOperationFrom(r.GetOperation(), r.GetCreated()), nil
}

// GetBulkOperation returns a bulk operation with its progress and counts.
// NOT_FOUND when it does not exist in the caller's namespace.
func (c *Client) GetBulkOperation(ctx context.Context, id string) (*BulkOperation, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.GetBulkOperation(ctx, &pb.GetBulkOperationRequest{OperationId: id}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return bulkOperationFrom(r.GetOperation(), false), nil
}

// ListBulkOperations iterates over the namespace's bulk operations, newest
// first, fetching pageSize at a time (0: 100). Iteration stops at the first
// error, which it yields.
func (c *Client) ListBulkOperations(ctx context.Context, pageSize int) iter.Seq2[*BulkOperation, error] {
	return paged(ctx, c, func(ctx context.Context, token string) ([]*BulkOperation, string, error) {
		r, err := c.runs.ListBulkOperations(ctx, &pb.ListBulkOperationsRequest{PageSize: int32(pageSize), PageToken: token}, waitForReady)
		return convertAll(r.GetOperations(), listedBulkOperationFrom), r.GetNextPageToken(), err
	})
}

// CancelBulkOperation stops a bulk operation after the run it is on: runs
// already acted on stay as they are, the rest are left alone, and it ends
// BulkCancelled with its counts so far. The answer may still show it
// running until its server sees the request (within one batch).
// FAILED_PRECONDITION when it already ended.
func (c *Client) CancelBulkOperation(ctx context.Context, id string) (*BulkOperation, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.runs.CancelBulkOperation(ctx, &pb.CancelBulkOperationRequest{OperationId: id}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return bulkOperationFrom(r.GetOperation(), false), nil
}

// bulkPollBackoff spaces WaitBulkOperation's polls: soon at first (a small
// operation ends within a batch), then every second or two.
var bulkPollBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Multiplier: 1.5, Jitter: 0.2}

// WaitBulkOperation polls a bulk operation, with a growing delay, until it
// ends (BulkSucceeded, BulkCancelled or BulkFailed) and returns it. An
// UNAVAILABLE or DEADLINE_EXCEEDED poll is tried again; another error is
// returned. When ctx ends first the error wraps ctx's
// (errors.Is(err, context.DeadlineExceeded) for a timeout).
func (c *Client) WaitBulkOperation(ctx context.Context, id string) (*BulkOperation, error) {
	for polls := 1; ; polls++ {
		op, err := c.GetBulkOperation(ctx, id)
		if ctx.Err() != nil {
			break
		}
		if err != nil && !IsRetryable(err) {
			return nil, err
		}
		if err == nil && op.Status.IsFinal() {
			return op, nil
		}
		if !sleepCtx(ctx, bulkPollBackoff.Delay(polls)) {
			break
		}
	}
	return nil, fmt.Errorf("composer: waiting for bulk operation %s: %w", id, context.Cause(ctx))
}
