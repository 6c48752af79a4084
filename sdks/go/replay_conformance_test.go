package composer_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

// heldAmount is the run input whose B task waits for the test to release it,
// so the run stays in flight in B; runs of any other amount go straight
// through.
const heldAmount = 30

// orderDefinition is `name` A → B → C on queue, B running task bTask, and
// with withD a task D appended after C.
func orderDefinition(name, queue, bTask string, withD bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nnodes:\n", name)
	fmt.Fprintf(&b, "  - { id: A, type: TASK, queue: %s, task: a }\n", queue)
	fmt.Fprintf(&b, "  - { id: B, type: TASK, queue: %s, task: %s, input: { amount: \"${nodes.A.output.amount}\" } }\n", queue, bTask)
	fmt.Fprintf(&b, "  - { id: C, type: TASK, queue: %s, task: c }\n", queue)
	if withD {
		fmt.Fprintf(&b, "  - { id: D, type: TASK, queue: %s, task: d }\n", queue)
	}
	b.WriteString("edges:\n  - { from: A, to: B }\n  - { from: B, to: C }\n")
	if withD {
		b.WriteString("  - { from: C, to: D }\n")
	}
	return b.String()
}

// orderWorker serves order's tasks on queue until the test ends: a answers
// the run input's amount, b waits for release when the amount is
// heldAmount, c and d answer at once (d noting the run it ran for).
type orderWorker struct {
	release chan struct{}
	mu      sync.Mutex
	ranD    []string
}

func startOrderWorker(t *testing.T, client *composer.Client, queue string) *orderWorker {
	t.Helper()
	o := &orderWorker{release: make(chan struct{})}
	w := composer.NewWorker(client, fast(4))
	type amount struct {
		Amount int `json:"amount"`
	}
	w.Handle(queue, "a", composer.Typed(func(_ context.Context, in amount) (amount, error) { return in, nil }))
	w.Handle(queue, "b", func(ctx context.Context, task *composer.Task) (any, error) {
		var in amount
		if err := task.Decode(&in); err != nil {
			return nil, err
		}
		if in.Amount == heldAmount {
			select {
			case <-o.release:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
		return map[string]int{"charged": in.Amount}, nil
	})
	w.Handle(queue, "c", func(context.Context, *composer.Task) (any, error) { return "shipped", nil })
	w.Handle(queue, "d", func(_ context.Context, task *composer.Task) (any, error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.ranD = append(o.ranD, task.RunID)
		return "invoiced", nil
	})
	serve(t, w)
	// Cleanups run last first: B's held attempts end before the worker stops.
	t.Cleanup(o.releaseHeld)
	return o
}

func (o *orderWorker) releaseHeld() {
	select {
	case <-o.release:
	default:
		close(o.release)
	}
}

func (o *orderWorker) ranDFor(runID string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Contains(o.ranD, runID)
}

// startHeldInB starts a run of name that the worker holds in B, and waits
// until it is there.
func startHeldInB(ctx context.Context, t *testing.T, client *composer.Client, name string) string {
	t.Helper()
	run, err := client.StartRun(ctx, name, map[string]int{"amount": heldAmount})
	if err != nil {
		t.Fatal(err)
	}
	until(t, 60*time.Second, "the run running B", func() bool {
		r, err := client.GetRun(ctx, run.ID)
		if err != nil {
			t.Fatal(err)
		}
		return r.Node("A") != nil && r.Node("A").Status == composer.NodeCompleted &&
			r.Node("B") != nil && r.Node("B").Status == composer.NodeRunning
	})
	return run.ID
}

func register(ctx context.Context, t *testing.T, client *composer.Client, source string) *composer.WorkflowVersion {
	t.Helper()
	v, err := client.RegisterWorkflow(ctx, composer.YAML([]byte(source)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// recordedByCLI is what `composer run history RUN_ID -o json` writes for
// the run, parsed.
func recordedByCLI(t *testing.T, addr, runID string) *composer.RecordedRun {
	t.Helper()
	cmd := exec.Command(composerBin(), "run", "history", runID, "-o", "json", "--limit", "1000", "--address", "http://"+addr)
	cmd.Env = os.Environ() // COMPOSER_TOKEN, as services set it
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("composer run history: %v", err)
	}
	recorded, err := composer.ParseRecordedRun(out)
	if err != nil {
		t.Fatalf("the history composer wrote does not parse: %v\n%s", err, out)
	}
	return recorded
}

func expectVerdict(t *testing.T, what string, replay *composer.RunReplay, err error, want composer.ReplayVerdict) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if replay.Verdict != want {
		t.Errorf("%s: %s (%+v, divergence %+v), want %s", what, replay.Verdict, replay, replay.Divergence, want)
	}
}

// ReplayRun and CheckWorkflowVersion against the real server: a run of v1
// (A → B → C) waiting in B can go on under a version with D appended
// (compatible), not under one whose B runs another task (incompatible),
// whether the server reads the run or is given its recorded history.
func TestReplayRunAndCheckWorkflowVersion(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 180*time.Second)
	client := dial(t, addr)
	name, queue := "order-"+n, "replay-"+n
	startOrderWorker(t, client, queue)
	v1 := register(ctx, t, client, orderDefinition(name, queue, "b", false))

	// Two runs that completed, then two held in B.
	for range 2 {
		run, err := client.StartRun(ctx, name, map[string]int{"amount": 5})
		if err != nil {
			t.Fatal(err)
		}
		if r := finalRun(t, client, run.ID, 60*time.Second); r.Status != composer.RunCompleted {
			t.Fatalf("a run ended %s", r.Status)
		}
	}
	held := startHeldInB(ctx, t, client, name)
	startHeldInB(ctx, t, client, name)

	appended := orderDefinition(name, queue, "b", true)
	renamed := orderDefinition(name, queue, "b2", false)
	v2 := register(ctx, t, client, appended)
	v3 := register(ctx, t, client, renamed)
	if v1.Version != 1 || v2.Version != 2 || v3.Version != 3 {
		t.Fatalf("registered versions %d, %d, %d", v1.Version, v2.Version, v3.Version)
	}

	// Online: the server reads the run.
	replay, err := client.ReplayRun(ctx, composer.RunByID(held), composer.ReplayOptions{Version: v2.Version})
	expectVerdict(t, "the run against D appended (version)", replay, err, composer.ReplayCompatible)
	if replay.RunID != held || replay.WorkflowVersion != 1 || replay.Status != composer.RunRunning || replay.Events == 0 ||
		!slices.ContainsFunc(replay.Differences, func(d composer.ReplayDifference) bool { return d.Kind == "node_added" && d.NodeID == "D" }) {
		t.Errorf("compatible replay %+v", replay)
	}
	replay, err = client.ReplayRun(ctx, composer.RunByID(held), composer.ReplayOptions{Source: composer.YAML([]byte(renamed))})
	expectVerdict(t, "the run against B's task renamed (source)", replay, err, composer.ReplayIncompatible)
	if d := replay.Divergence; d == nil || d.Rule != "node_changed" || d.NodeID != "B" || d.Message == "" {
		t.Errorf("divergence %+v", replay.Divergence)
	}
	replay, err = client.ReplayRun(ctx, composer.RunByID(held), composer.ReplayOptions{Version: v1.Version})
	expectVerdict(t, "the run against its own version", replay, err, composer.ReplayIdentical)

	// Offline: the history `composer run history -o json` wrote, given whole.
	recorded := recordedByCLI(t, addr, held)
	if recorded.Run().ID != held || recorded.Workflow().Version != 1 || len(recorded.Events()) < 4 {
		t.Errorf("recorded run %s v%d with %d events", recorded.Run().ID, recorded.Workflow().Version, len(recorded.Events()))
	}
	replay, err = client.ReplayRun(ctx, recorded, composer.ReplayOptions{Source: composer.YAML([]byte(appended))})
	expectVerdict(t, "the recorded run against D appended", replay, err, composer.ReplayCompatible)
	replay, err = client.ReplayRun(ctx, recorded, composer.ReplayOptions{Version: v3.Version})
	expectVerdict(t, "the recorded run against B's task renamed", replay, err, composer.ReplayIncompatible)
	// The committed fixture (order v1, waiting in B) replays with no run of
	// it on the server.
	fixture, err := os.ReadFile(filepath.Join(repoRoot, "tests", "fixtures", "replay", "order-waiting-in-b.history.json"))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := composer.ParseRecordedRun(fixture)
	if err != nil {
		t.Fatal(err)
	}
	fixtureWithD := orderDefinition("order", "replay", "b", true)
	replay, err = client.ReplayRun(ctx, committed, composer.ReplayOptions{Source: composer.YAML([]byte(fixtureWithD))})
	expectVerdict(t, "the committed history against D appended", replay, err, composer.ReplayCompatible)
	// B renamed B2, the rename named: the run goes on in B2.
	renamedB := strings.NewReplacer("id: B,", "id: B2,", "to: B }", "to: B2 }", "from: B,", "from: B2,").Replace(fixtureWithD)
	replay, err = client.ReplayRun(ctx, committed, composer.ReplayOptions{
		Source: composer.YAML([]byte(renamedB)), NodeMapping: map[string]string{"B": "B2"},
	})
	expectVerdict(t, "the committed history against B renamed B2, mapped", replay, err, composer.ReplayCompatible)
	if !slices.ContainsFunc(replay.Differences, func(d composer.ReplayDifference) bool { return d.Kind == "node_renamed" }) {
		t.Errorf("the rename is not among the differences: %+v", replay.Differences)
	}

	// Every run in flight, paged one run a call and summed.
	check, err := client.CheckWorkflowVersion(ctx, name, composer.CheckWorkflowVersionOptions{Version: v2.Version, PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if check.Checked != 2 || check.Compatible != 2 || check.Incompatible != 0 || len(check.Runs) != 2 {
		t.Errorf("in flight against D appended: %+v", check)
	}
	check, err = client.CheckWorkflowVersion(ctx, name, composer.CheckWorkflowVersionOptions{Source: composer.YAML([]byte(renamed))})
	if err != nil {
		t.Fatal(err)
	}
	if check.Checked != 2 || check.Incompatible != 2 || len(check.Runs) != 2 || check.Runs[0].Divergence == nil ||
		check.Runs[0].Divergence.Rule != "node_changed" {
		t.Errorf("in flight against B's task renamed: %+v", check)
	}
	// The completed runs, all or the latest one.
	check, err = client.CheckWorkflowVersion(ctx, name, composer.CheckWorkflowVersionOptions{Version: v1.Version, Scope: composer.CheckCompleted})
	if err != nil {
		t.Fatal(err)
	}
	if check.Checked != 2 || check.Identical != 2 || len(check.Runs) != 0 {
		t.Errorf("completed against their own version: %+v", check)
	}
	check, err = client.CheckWorkflowVersion(ctx, name, composer.CheckWorkflowVersionOptions{
		Version: v3.Version, Scope: composer.CheckCompleted, Limit: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if check.Checked != 1 || check.Incompatible != 1 || len(check.Runs) != 1 {
		t.Errorf("the latest completed run against B's task renamed: %+v", check)
	}

	// What the server refuses.
	_, err = client.ReplayRun(ctx, composer.RunByID(held), composer.ReplayOptions{
		Source: composer.YAML([]byte("name: " + name + "\nnodes:\n  - { id: A, type: TASK, queue: q }\n")),
	})
	if !composer.IsInvalidArgument(err) {
		t.Errorf("an invalid new definition: %v", err)
	}
	_, err = client.ReplayRun(ctx, composer.RunByID("0190f1a2-0000-7000-8000-000000000000"), composer.ReplayOptions{Version: 1})
	if !composer.IsNotFound(err) {
		t.Errorf("an unknown run: %v", err)
	}
}

// MigrateRuns moves a run waiting in B from v1 to a v2 with D appended: it
// goes on under v2 and runs D; a version whose B runs another task is
// refused for it, the divergence in the operation's failures.
func TestMigrateRunsMovesARunInFlightToACompatibleVersion(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 180*time.Second)
	client := dial(t, addr)
	name, queue := "migrate-"+n, "migrate-"+n
	worker := startOrderWorker(t, client, queue)
	register(ctx, t, client, orderDefinition(name, queue, "b", false))
	held := startHeldInB(ctx, t, client, name)
	v2 := register(ctx, t, client, orderDefinition(name, queue, "b", true))
	v3 := register(ctx, t, client, orderDefinition(name, queue, "b2", true))
	filter := composer.RunFilter{Workflow: name}

	refused, err := client.MigrateRuns(ctx, filter, v3.Version, nil)
	if err != nil {
		t.Fatal(err)
	}
	if refused.Kind != composer.BulkKindMigrate || refused.TargetVersion != v3.Version || !refused.Created {
		t.Errorf("migrate to v3 started %+v", refused)
	}
	refused = waitOperation(ctx, t, client, refused)
	if refused.Status != composer.BulkSucceeded || refused.Matched != 1 || refused.Failed != 1 || len(refused.Failures) != 1 ||
		refused.Failures[0].RunID != held || !strings.Contains(refused.Failures[0].Message, "node_changed") {
		t.Errorf("migrate to an incompatible version ended %+v", refused)
	}
	if r, err := client.GetRun(ctx, held); err != nil || r.WorkflowVersion != 1 {
		t.Fatalf("after the refused migration the run is on %+v, %v", r, err)
	}

	moved, err := client.MigrateRuns(ctx, filter, v2.Version, map[string]string{}, composer.WithRequestID("move-"+n))
	if err != nil {
		t.Fatal(err)
	}
	moved = waitOperation(ctx, t, client, moved)
	expectCounts(t, moved, 1, 1, 0, 0)
	if moved.Kind != composer.BulkKindMigrate || moved.TargetVersion != v2.Version {
		t.Errorf("migrate to v2 ended %+v", moved)
	}
	if r, err := client.GetRun(ctx, held); err != nil || r.WorkflowVersion != v2.Version || r.Status != composer.RunRunning {
		t.Fatalf("after the migration the run is %+v, %v", r, err)
	}

	// B, leased under v1, finishes; C and then D run under v2.
	worker.releaseHeld()
	run := finalRun(t, client, held, 60*time.Second)
	if run.Status != composer.RunCompleted || run.Node("D") == nil || run.Node("D").Status != composer.NodeCompleted || !worker.ranDFor(held) {
		t.Errorf("the migrated run ended %s with D %+v (worker ran D: %v)", run.Status, run.Node("D"), worker.ranDFor(held))
	}
	if types := historyTypes(t, client, held); !slices.Contains(types, "run_migrated") {
		t.Errorf("the history has no run_migrated: %v", types)
	}

	// A version the workflow does not have is refused, naming the field.
	_, err = client.MigrateRuns(ctx, filter, 99, nil)
	if fields := violationFields(t, err); !slices.Contains(fields, "target_version") {
		t.Errorf("an unknown target version: fields %v", fields)
	}
}
