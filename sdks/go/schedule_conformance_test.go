package composer_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	composer "github.com/composer-dev/composer/sdks/go"
)

// violationFields lists the fields of err's violations, failing the test
// unless err is INVALID_ARGUMENT.
func violationFields(t *testing.T, err error) []string {
	t.Helper()
	var ce *composer.Error
	if !errors.As(err, &ce) || !composer.IsInvalidArgument(err) {
		t.Fatalf("want INVALID_ARGUMENT, got %v", err)
	}
	var fields []string
	for _, v := range ce.FieldViolations {
		fields = append(fields, v.Field)
	}
	return fields
}

func TestC17SchedulesFireRunsAndARunPausesAndResumes(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 150*time.Second)
	client := dial(t, addr)
	tick, waiting := "tick-"+n, "paused-"+n
	for _, src := range []string{
		"name: " + tick + "\nnodes:\n  - { id: nap, type: WAIT, duration: 1ms }\n",
		"name: " + waiting + "\nnodes:\n  - { id: go, type: WAIT_FOR_EVENT, event: go }\n" +
			"output: { got: \"${nodes.go.output}\" }\n",
	} {
		if _, err := client.RegisterWorkflow(ctx, composer.YAML([]byte(src))); err != nil {
			t.Fatal(err)
		}
	}

	// An interval schedule of 1 s fires a run labelled with its id.
	sid := "every-second-" + n
	def := composer.ScheduleDefinition{
		Spec: composer.ScheduleSpec{Interval: time.Second}, Workflow: tick, Input: map[string]int{"n": 1},
		Labels: map[string]string{"suite": n}, OverlapPolicy: composer.OverlapAllowAll,
	}
	created, err := client.CreateSchedule(ctx, sid, def)
	if err != nil {
		t.Fatal(err)
	}
	if created.ID != sid || created.Spec.Interval != time.Second || created.Action.Workflow != tick ||
		string(created.Action.Input) != `{"n":1}` || created.OverlapPolicy != composer.OverlapAllowAll ||
		created.Paused || len(created.NextFireTimes) == 0 || created.CatchUpWindow != time.Minute {
		t.Errorf("created %+v", created)
	}
	if _, err := client.CreateSchedule(ctx, sid, def); !composer.IsAlreadyExists(err) {
		t.Errorf("creating again: %v", err)
	}
	var runs []*composer.Run
	until(t, 60*time.Second, "a fire's run", func() bool {
		runs = nil
		for r, err := range client.ListRuns(ctx, composer.RunFilter{Labels: map[string]string{"composer.schedule": sid}}) {
			if err != nil {
				t.Fatal(err)
			}
			runs = append(runs, r)
		}
		return len(runs) > 0
	})
	if runs[0].Labels["suite"] != n || runs[0].Labels["composer.fire_time"] == "" {
		t.Errorf("labels %v", runs[0].Labels)
	}
	if r := finalRun(t, client, runs[0].ID, 60*time.Second); r.Status != composer.RunCompleted {
		t.Errorf("fired run %s", r.Status)
	}
	seen, err := client.GetSchedule(ctx, sid)
	if err != nil {
		t.Fatal(err)
	}
	if seen.FiredCount < 1 || !slices.ContainsFunc(seen.RecentFires, func(f composer.ScheduleFire) bool {
		return f.Outcome == composer.FireStarted && f.RunID != ""
	}) {
		t.Errorf("after a fire: %d fired, recent %+v", seen.FiredCount, seen.RecentFires)
	}
	var ids []string
	for s, err := range client.ListSchedules(ctx, 1) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	if !slices.Contains(ids, sid) {
		t.Errorf("listed %v", ids)
	}

	// Paused: no next fire times and no more fires; a trigger still fires.
	paused, err := client.PauseSchedule(ctx, sid, "maintenance")
	if err != nil || !paused.Paused || paused.Note != "maintenance" || len(paused.NextFireTimes) != 0 {
		t.Fatalf("pause: %+v, %v", paused, err)
	}
	time.Sleep(1500 * time.Millisecond) // a fire decided before the pause may still land
	before, _ := client.GetSchedule(ctx, sid)
	time.Sleep(2500 * time.Millisecond)
	if after, _ := client.GetSchedule(ctx, sid); after.FiredCount != before.FiredCount {
		t.Errorf("fired while paused: %d then %d", before.FiredCount, after.FiredCount)
	}
	fire, err := client.TriggerSchedule(ctx, sid)
	if err != nil || fire.Outcome != composer.FireStarted || fire.RunID == "" {
		t.Fatalf("trigger: %+v, %v", fire, err)
	}
	if r, err := client.GetRun(ctx, fire.RunID); err != nil || r.Labels["composer.schedule"] != sid {
		t.Errorf("triggered run: %v", err)
	}
	resumed, err := client.ResumeSchedule(ctx, sid, "back")
	if err != nil || resumed.Paused || resumed.Note != "back" || len(resumed.NextFireTimes) == 0 {
		t.Fatalf("resume: %+v, %v", resumed, err)
	}

	// Update replaces the definition; the counters stay.
	updated, err := client.UpdateSchedule(ctx, sid, composer.ScheduleDefinition{
		Spec: composer.ScheduleSpec{Cron: "0 0 1 1 *", TimeZone: "Europe/Berlin"}, Workflow: tick,
		Input: map[string]int{"n": 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if updated.Spec.Cron != "0 0 1 1 *" || updated.Spec.Interval != 0 || updated.Spec.TimeZone != "Europe/Berlin" ||
		string(updated.Action.Input) != `{"n":2}` || updated.FiredCount < before.FiredCount+1 ||
		updated.OverlapPolicy != composer.OverlapSkip {
		t.Errorf("updated %+v", updated)
	}

	// Errors name the field; a missing id is not found.
	_, err = client.CreateSchedule(ctx, "bad-"+n, composer.ScheduleDefinition{
		Spec: composer.ScheduleSpec{Cron: "not a cron"}, Workflow: tick,
	})
	if fields := violationFields(t, err); !slices.Contains(fields, "spec.cron") {
		t.Errorf("bad cron: fields %v", fields)
	}
	if _, err := client.GetSchedule(ctx, "missing-"+n); !composer.IsNotFound(err) {
		t.Errorf("get of a missing schedule: %v", err)
	}
	if err := client.DeleteSchedule(ctx, sid); err != nil {
		t.Fatal(err)
	}
	if _, err := client.GetSchedule(ctx, sid); !composer.IsNotFound(err) {
		t.Errorf("get after delete: %v", err)
	}
	if err := client.DeleteSchedule(ctx, sid); !composer.IsNotFound(err) {
		t.Errorf("delete again: %v", err)
	}
	if _, err := client.TriggerSchedule(ctx, sid); !composer.IsNotFound(err) {
		t.Errorf("trigger of a deleted schedule: %v", err)
	}

	// Pause a run waiting on an event; resumed, it completes on the event.
	run, err := client.StartRun(ctx, waiting, nil, composer.WithPriority(5))
	if err != nil || run.Priority != 5 || run.Status != composer.RunRunning {
		t.Fatalf("start: %+v, %v", run, err)
	}
	held, err := client.PauseRun(ctx, run.ID, "hold on")
	if err != nil || held.Status != composer.RunPaused || held.Status.String() != "PAUSED" {
		t.Fatalf("pause: %+v, %v", held, err)
	}
	if got, err := client.GetRun(ctx, run.ID); err != nil || got.Status != composer.RunPaused {
		t.Fatalf("get of a paused run: %+v, %v", got, err)
	}
	var listed []string
	for r, err := range client.ListRuns(ctx, composer.RunFilter{Workflow: waiting, Statuses: []composer.RunStatus{composer.RunPaused}}) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, r.ID)
	}
	if !slices.Equal(listed, []string{run.ID}) {
		t.Errorf("paused runs %v", listed)
	}
	if again, err := client.PauseRun(ctx, run.ID, ""); err != nil || again.Status != composer.RunPaused {
		t.Errorf("pause again: %v", err)
	}
	back, err := client.ResumeRun(ctx, run.ID)
	if err != nil || back.Status != composer.RunRunning {
		t.Fatalf("resume: %+v, %v", back, err)
	}
	if _, err := client.SendEvent(ctx, composer.Event{Name: "go", Payload: map[string]int{"ok": 1}, RunID: run.ID}); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Got json.RawMessage `json:"got"`
	}
	if err := client.WaitForResult(ctx, run.ID, &out); err != nil || string(out.Got) != `{"ok":1}` {
		t.Errorf("result %s, %v", out.Got, err)
	}
	if _, err := client.PauseRun(ctx, run.ID, ""); !composer.IsFailedPrecondition(err) {
		t.Errorf("pause of an ended run: %v", err)
	}

	// Priority: the default is 3; 9 is refused naming the field.
	if r, err := client.StartRun(ctx, tick, nil); err != nil || r.Priority != 3 {
		t.Errorf("default priority: %+v, %v", r, err)
	}
	_, err = client.StartRun(ctx, tick, nil, composer.WithPriority(9))
	if fields := violationFields(t, err); !slices.Contains(fields, "priority") {
		t.Errorf("priority 9: fields %v", fields)
	}
}
