package composer_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

// waitOperation waits for a bulk operation to end, failing the test on an error.
func waitOperation(ctx context.Context, t *testing.T, c *composer.Client, op *composer.BulkOperation) *composer.BulkOperation {
	t.Helper()
	done, err := c.WaitBulkOperation(ctx, op.ID)
	if err != nil {
		t.Fatalf("waiting for the %s operation %s: %v", op.Kind, op.ID, err)
	}
	return done
}

// expectCounts checks an ended operation's status and counts.
func expectCounts(t *testing.T, op *composer.BulkOperation, matched, succeeded, skipped, failed int64) {
	t.Helper()
	if op.Status != composer.BulkSucceeded || op.Matched != matched || op.Succeeded != succeeded ||
		op.Skipped != skipped || op.Failed != failed || op.EndTime.IsZero() {
		t.Errorf("%s operation ended %s with matched %d, succeeded %d, skipped %d, failed %d (end %v, error %q); want SUCCEEDED %d/%d/%d/%d",
			op.Kind, op.Status, op.Matched, op.Succeeded, op.Skipped, op.Failed, op.EndTime, op.Error,
			matched, succeeded, skipped, failed)
	}
}

// runStatuses reads the status of each run.
func runStatuses(ctx context.Context, t *testing.T, c *composer.Client, ids []string) []composer.RunStatus {
	t.Helper()
	var out []composer.RunStatus
	for _, id := range ids {
		r, err := c.GetRun(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r.Status)
	}
	return out
}

func allAre(statuses []composer.RunStatus, want composer.RunStatus) bool {
	return len(statuses) > 0 && !slices.ContainsFunc(statuses, func(s composer.RunStatus) bool { return s != want })
}

func TestC18BulkActionsActOnEveryMatchingRun(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 180*time.Second)
	client := dial(t, addr)
	queue := "bulk-" + n
	var failing atomic.Bool
	failing.Store(true)
	w := composer.NewWorker(client, fast(4))
	w.Handle(queue, "shaky", func(ctx context.Context, task *composer.Task) (any, error) {
		if failing.Load() {
			return nil, composer.NonRetryable(&composer.TaskError{Code: "DOWN", Message: "the backend is down"})
		}
		return "recovered", nil
	})
	w.Handle(queue, "steady", func(ctx context.Context, task *composer.Task) (any, error) { return "fine", nil })
	serve(t, w)
	shaky, steady, waiting := "bulk-shaky-"+n, "bulk-steady-"+n, "bulk-wait-"+n
	for _, src := range []composer.Source{
		oneTask(shaky, queue, "shaky", ""),
		oneTask(steady, queue, "steady", ""),
		composer.YAML([]byte("name: " + waiting + "\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\n")),
	} {
		if _, err := client.RegisterWorkflow(ctx, src); err != nil {
			t.Fatal(err)
		}
	}

	// 6 runs fail and 2 complete, all with the test's label.
	labels := map[string]string{"bulk": n}
	start := func(workflow string, labels map[string]string) string {
		t.Helper()
		r, err := client.StartRun(ctx, workflow, nil, composer.WithLabels(labels))
		if err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	var failed []string
	for range 6 {
		failed = append(failed, start(shaky, labels))
	}
	for range 2 {
		if r := finalRun(t, client, start(steady, labels), 60*time.Second); r.Status != composer.RunCompleted {
			t.Fatalf("a steady run ended %s", r.Status)
		}
	}
	for _, id := range failed {
		if r := finalRun(t, client, id, 60*time.Second); r.Status != composer.RunFailed {
			t.Fatalf("a shaky run ended %s", r.Status)
		}
	}

	// One call retries the 6 failed runs and skips the 2 completed ones.
	failing.Store(false)
	retryID := "retry-" + n
	retry, err := client.BulkRetryRuns(ctx, composer.RunFilter{Labels: labels}, composer.WithRequestID(retryID))
	if err != nil {
		t.Fatal(err)
	}
	if retry.ID == "" || !retry.Created || retry.Kind != composer.BulkKindRetry || retry.Filter.Labels["bulk"] != n {
		t.Errorf("retry started %+v", retry)
	}
	expectCounts(t, waitOperation(ctx, t, client, retry), 8, 6, 2, 0)
	for _, id := range failed {
		if r := finalRun(t, client, id, 60*time.Second); r.Status != composer.RunCompleted {
			t.Errorf("retried run %s ended %s", id, r.Status)
		}
	}
	again, err := client.BulkRetryRuns(ctx, composer.RunFilter{Labels: labels}, composer.WithRequestID(retryID))
	if err != nil || again.ID != retry.ID || again.Created {
		t.Errorf("the same request id again: %+v, %v", again, err)
	}

	// 3 runs waiting on an event: paused, resumed, then cancelled, each by one call.
	waitLabels := map[string]string{"bulk": "wait-" + n}
	var held []string
	for range 3 {
		held = append(held, start(waiting, waitLabels))
	}
	filter := composer.RunFilter{Labels: waitLabels}
	pause, err := client.BulkPauseRuns(ctx, filter, "maintenance")
	if err != nil {
		t.Fatal(err)
	}
	pause = waitOperation(ctx, t, client, pause)
	expectCounts(t, pause, 3, 3, 0, 0)
	if pause.Kind != composer.BulkKindPause || pause.Reason != "maintenance" {
		t.Errorf("pause %+v", pause)
	}
	if got := runStatuses(ctx, t, client, held); !allAre(got, composer.RunPaused) {
		t.Errorf("after the bulk pause: %v", got)
	}
	resume, err := client.BulkResumeRuns(ctx, filter)
	if err != nil {
		t.Fatal(err)
	}
	resume = waitOperation(ctx, t, client, resume)
	expectCounts(t, resume, 3, 3, 0, 0)
	if got := runStatuses(ctx, t, client, held); !allAre(got, composer.RunRunning) {
		t.Errorf("after the bulk resume: %v", got)
	}
	cancelled, err := client.BulkCancelRuns(ctx, filter, "no longer needed")
	if err != nil {
		t.Fatal(err)
	}
	cancelled = waitOperation(ctx, t, client, cancelled)
	expectCounts(t, cancelled, 3, 3, 0, 0)
	if cancelled.Kind != composer.BulkKindCancel || cancelled.Reason != "no longer needed" {
		t.Errorf("cancel %+v", cancelled)
	}
	if got := runStatuses(ctx, t, client, held); !allAre(got, composer.RunCancelled) {
		t.Errorf("after the bulk cancel: %v", got)
	}

	// Listed newest first, a page of 2 at a time.
	var listed []string
	for op, err := range client.ListBulkOperations(ctx, 2) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, op.ID)
	}
	order := []int{}
	for _, id := range []string{cancelled.ID, resume.ID, pause.ID, retry.ID} {
		order = append(order, slices.Index(listed, id))
	}
	if slices.Contains(order, -1) || !slices.IsSorted(order) {
		t.Errorf("listed %v: cancel, resume, pause, retry at %v", listed, order)
	}

	// Refusals.
	if _, err := client.BulkCancelRuns(ctx, composer.RunFilter{}, "everything"); !composer.IsFailedPrecondition(err) {
		t.Errorf("an empty filter without all: %v", err)
	}
	_, err = client.BulkCancelRuns(ctx, composer.RunFilter{WorkflowVersion: 1}, "")
	if fields := violationFields(t, err); !slices.Contains(fields, "filter.workflow_version") {
		t.Errorf("a version without a workflow: fields %v", fields)
	}
	if _, err := client.GetBulkOperation(ctx, "0190f1a2-0000-7000-8000-000000000000"); !composer.IsNotFound(err) {
		t.Errorf("get of an unknown operation: %v", err)
	}
	if _, err := client.CancelBulkOperation(ctx, pause.ID); !composer.IsFailedPrecondition(err) {
		t.Errorf("cancel of an ended operation: %v", err)
	}
}
