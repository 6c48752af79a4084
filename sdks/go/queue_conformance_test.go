package composer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

func TestC19QueueRateLimitsAndQueuedRuns(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 180*time.Second)
	client := dial(t, addr)
	queue := "rate-" + n

	// A limit of 2 per second with a burst of 2, read back and listed.
	set, err := client.SetQueueRateLimit(ctx, composer.QueueRateLimit{Queue: queue, PerSecond: 2, Burst: 2})
	if err != nil {
		t.Fatal(err)
	}
	if set.Queue != queue || set.PerSecond != 2 || set.Burst != 2 || set.PerKeyPerSecond != 0 ||
		set.PerKeyBurst != 0 || set.CreateTime.IsZero() || set.UpdateTime.IsZero() {
		t.Errorf("set answered %+v", set)
	}
	got, err := client.GetQueueRateLimit(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	if got.Queue != queue || got.PerSecond != 2 || got.Burst != 2 || !got.CreateTime.Equal(set.CreateTime) {
		t.Errorf("get answered %+v, set %+v", got, set)
	}
	var listed []composer.QueueRateLimit
	for l, err := range client.ListQueueRateLimits(ctx, 1) {
		if err != nil {
			t.Fatal(err)
		}
		if l.Queue == queue {
			listed = append(listed, *l)
		}
	}
	if len(listed) != 1 || listed[0].PerSecond != 2 || listed[0].Burst != 2 {
		t.Errorf("listed (a page of 1 at a time) %+v", listed)
	}
	// A change reaches every server's dispatch within about a second.
	time.Sleep(1500 * time.Millisecond)

	// 6 one-task runs started at once go out 2 at a time: the last ends no
	// sooner than 1.5 s after the first started.
	w := composer.NewWorker(client, fast(8))
	w.Handle(queue, "work", func(ctx context.Context, task *composer.Task) (any, error) {
		var in struct{ I int }
		err := json.Unmarshal(task.Input, &in)
		return in.I, err
	})
	serve(t, w)
	limited := "rate-limited-" + n
	if _, err := client.RegisterWorkflow(ctx, oneTask(limited, queue, "work", `input: { i: "${input.i}" }`)); err != nil {
		t.Fatal(err)
	}
	runs := make([]*composer.Run, 6)
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() { runs[i], errs[i] = client.StartRun(ctx, limited, map[string]int{"i": i}) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var firstStart, lastEnd time.Time
	for i, started := range runs {
		r := finalRun(t, client, started.ID, 60*time.Second)
		if r.Status != composer.RunCompleted || string(r.Output) != fmt.Sprintf(`{"result":%d}`, i) {
			t.Errorf("run %d ended %s with %s (%+v)", i, r.Status, r.Output, r.Error)
		}
		if r.ConcurrencyKey != "" {
			t.Errorf("a run of a workflow without concurrency has the key %q", r.ConcurrencyKey)
		}
		if firstStart.IsZero() || started.CreateTime.Before(firstStart) {
			firstStart = started.CreateTime
		}
		if r.EndTime.After(lastEnd) {
			lastEnd = r.EndTime
		}
	}
	took := lastEnd.Sub(firstStart)
	t.Logf("6 runs at 2/s (burst 2): %s from the first start to the last end", took)
	if took < 1500*time.Millisecond {
		t.Errorf("6 runs at 2/s (burst 2) took only %s from the first start to the last end", took)
	}

	// A burst under the rate is refused naming limit.burst; the limit stays.
	_, err = client.SetQueueRateLimit(ctx, composer.QueueRateLimit{Queue: queue, PerSecond: 5, Burst: 2})
	if fields := violationFields(t, err); !slices.Contains(fields, "limit.burst") {
		t.Errorf("a burst under the rate: fields %v", fields)
	}
	if got, err := client.GetQueueRateLimit(ctx, queue); err != nil || got.PerSecond != 2 {
		t.Errorf("after the refused change: %+v, %v", got, err)
	}
	if err := client.DeleteQueueRateLimit(ctx, queue); err != nil {
		t.Fatal(err)
	}
	if got, err := client.GetQueueRateLimit(ctx, queue); !composer.IsNotFound(err) {
		t.Errorf("get after delete: %+v, %v", got, err)
	}

	// A concurrency key of max 1: the second run of the same key waits
	// QUEUED for the first.
	keyed := "rate-keyed-" + n
	src := "name: " + keyed + "\nconcurrency: { key: \"input.k\", max: 1 }\n" +
		"nodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\noutput: { got: \"${nodes.go.output}\" }\n"
	if _, err := client.RegisterWorkflow(ctx, composer.YAML([]byte(src))); err != nil {
		t.Fatal(err)
	}
	k := "customer-" + n
	first, err := client.StartRun(ctx, keyed, map[string]string{"k": k})
	if err != nil {
		t.Fatal(err)
	}
	second, err := client.StartRun(ctx, keyed, map[string]string{"k": k})
	if err != nil {
		t.Fatal(err)
	}
	if first.Status != composer.RunRunning || first.ConcurrencyKey != k {
		t.Errorf("the first run of the key is %s with key %q", first.Status, first.ConcurrencyKey)
	}
	if second.Status != composer.RunQueued || second.ConcurrencyKey != k {
		t.Errorf("the second run of the key is %s with key %q", second.Status, second.ConcurrencyKey)
	}
	seen, err := client.GetRun(ctx, second.ID)
	if err != nil {
		t.Fatal(err)
	}
	if seen.Status != composer.RunQueued || seen.ConcurrencyKey != k {
		t.Errorf("get of the second run: %s with key %q", seen.Status, seen.ConcurrencyKey)
	}
	var queued []string
	for r, err := range client.ListRuns(ctx, composer.RunFilter{Workflow: keyed, Statuses: []composer.RunStatus{composer.RunQueued}}) {
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, r.ID)
	}
	if !slices.Equal(queued, []string{second.ID}) {
		t.Errorf("QUEUED runs %v, want [%s]", queued, second.ID)
	}

	// The first completes on its event; the second then runs and completes
	// on its own.
	send := func(runID string, payload int) {
		t.Helper()
		if _, err := client.SendEvent(ctx, composer.Event{Name: "go", Payload: map[string]int{"n": payload}, RunID: runID}); err != nil {
			t.Fatal(err)
		}
	}
	send(first.ID, 1)
	if r := finalRun(t, client, first.ID, 60*time.Second); r.Status != composer.RunCompleted || string(r.Output) != `{"got":{"n":1}}` {
		t.Errorf("the first run ended %s with %s", r.Status, r.Output)
	}
	until(t, 30*time.Second, "the second run leaving QUEUED", func() bool {
		r, err := client.GetRun(ctx, second.ID)
		if err != nil {
			t.Fatal(err)
		}
		seen = r
		return r.Status != composer.RunQueued
	})
	if seen.Status != composer.RunRunning || seen.ConcurrencyKey != k {
		t.Errorf("the second run left QUEUED for %s with key %q", seen.Status, seen.ConcurrencyKey)
	}
	send(second.ID, 2)
	if r := finalRun(t, client, second.ID, 60*time.Second); r.Status != composer.RunCompleted || string(r.Output) != `{"got":{"n":2}}` {
		t.Errorf("the second run ended %s with %s", r.Status, r.Output)
	}
}
