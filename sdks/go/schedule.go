package composer

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// OverlapPolicy says what a schedule's fire does while the run of its
// previous fire still runs.
type OverlapPolicy int32

// The policies of composer.v1.OverlapPolicy.
const (
	// OverlapUnspecified is read by the server as OverlapSkip.
	OverlapUnspecified OverlapPolicy = OverlapPolicy(pb.OverlapPolicy_OVERLAP_POLICY_UNSPECIFIED)
	// OverlapSkip starts nothing; the fire counts in SkippedCount.
	OverlapSkip OverlapPolicy = OverlapPolicy(pb.OverlapPolicy_OVERLAP_POLICY_SKIP)
	// OverlapBufferOne keeps this one fire and starts it when the previous
	// run ends; further fires meanwhile are skipped.
	OverlapBufferOne OverlapPolicy = OverlapPolicy(pb.OverlapPolicy_OVERLAP_POLICY_BUFFER_ONE)
	// OverlapAllowAll starts anyway: runs may overlap.
	OverlapAllowAll OverlapPolicy = OverlapPolicy(pb.OverlapPolicy_OVERLAP_POLICY_ALLOW_ALL)
	// OverlapCancelPrevious cancels the previous run, then starts.
	OverlapCancelPrevious OverlapPolicy = OverlapPolicy(pb.OverlapPolicy_OVERLAP_POLICY_CANCEL_PREVIOUS)
)

// String is the policy's name without its prefix, e.g. SKIP.
func (p OverlapPolicy) String() string {
	return strings.TrimPrefix(pb.OverlapPolicy(p).String(), "OVERLAP_POLICY_")
}

// FireOutcome says how one fire of a schedule went.
type FireOutcome int32

// The outcomes of composer.v1.ScheduleFireOutcome.
const (
	FireOutcomeUnspecified FireOutcome = FireOutcome(pb.ScheduleFireOutcome_SCHEDULE_FIRE_OUTCOME_UNSPECIFIED)
	// FireStarted: a run started (ScheduleFire.RunID).
	FireStarted FireOutcome = FireOutcome(pb.ScheduleFireOutcome_SCHEDULE_FIRE_OUTCOME_STARTED)
	// FireSkipped: the overlap policy skipped it.
	FireSkipped FireOutcome = FireOutcome(pb.ScheduleFireOutcome_SCHEDULE_FIRE_OUTCOME_SKIPPED)
	// FireBuffered: kept until the previous run ends (OverlapBufferOne); its
	// start is a fire of its own.
	FireBuffered FireOutcome = FireOutcome(pb.ScheduleFireOutcome_SCHEDULE_FIRE_OUTCOME_BUFFERED)
	// FireFailed: no run could start; the schedule's LastError says why.
	FireFailed FireOutcome = FireOutcome(pb.ScheduleFireOutcome_SCHEDULE_FIRE_OUTCOME_FAILED)
)

// String is the outcome's name without its prefix, e.g. STARTED.
func (o FireOutcome) String() string {
	return strings.TrimPrefix(pb.ScheduleFireOutcome(o).String(), "SCHEDULE_FIRE_OUTCOME_")
}

// ScheduleSpec says when a schedule fires: Cron (read in TimeZone, UTC when
// empty) or a fixed Interval, exactly one.
type ScheduleSpec struct {
	// Cron has 5 fields (minute hour day-of-month month day-of-week), or 6
	// with seconds first.
	Cron string
	// TimeZone is the IANA zone Cron is read in, e.g. Europe/Berlin.
	TimeZone string
	// Interval is whole seconds, 1 s to 366 days, counted from the schedule's
	// creation (or last update).
	Interval time.Duration
}

// ScheduleDefinition is what CreateSchedule and UpdateSchedule send.
type ScheduleDefinition struct {
	Spec ScheduleSpec
	// Workflow is the workflow a fire starts, at Version (0: the latest at
	// each fire), with Input (any JSON-encodable value) and Labels. The run
	// also carries the labels composer.schedule (the id) and
	// composer.fire_time.
	Workflow string
	Version  int
	Input    any
	Labels   map[string]string
	// OverlapPolicy: what a fire does while the previous run still runs
	// (zero: OverlapSkip).
	OverlapPolicy OverlapPolicy
	// CatchUpWindow is how late a missed fire may start, 1 s to 7 days
	// (zero: 60 s).
	CatchUpWindow time.Duration
	// Jitter is the most a fire's start is delayed (zero: none).
	Jitter time.Duration
	// Paused creates the schedule paused, with Note (why). CreateSchedule
	// only: UpdateSchedule leaves both as they are.
	Paused bool
	Note   string
}

// ScheduleAction is the run a schedule's fire starts.
type ScheduleAction struct {
	Workflow string
	// Version is 0 for the latest at each fire.
	Version int
	Input   json.RawMessage
	Labels  map[string]string
}

// ScheduleFire is one fire of a schedule.
type ScheduleFire struct {
	// FireTime is the time the spec gave (before jitter).
	FireTime time.Time
	// RunID is the run it started; empty unless FireStarted.
	RunID   string
	Outcome FireOutcome
}

// Schedule is a schedule with its state (docs/schedules.md).
type Schedule struct {
	ID            string
	Namespace     string
	Spec          ScheduleSpec
	Action        ScheduleAction
	OverlapPolicy OverlapPolicy
	CatchUpWindow time.Duration
	Jitter        time.Duration
	Paused        bool
	// Note is the note of the last pause or resume.
	Note string
	// RecentFires are the last fires, newest first (at most 10).
	RecentFires []ScheduleFire
	// NextFireTimes are the next fire times (at most 10; none while paused).
	NextFireTimes []time.Time
	// FiredCount counts fires that started a run, SkippedCount those the
	// overlap policy skipped, MissedCount those older than the catch-up
	// window when the scheduler reached them.
	FiredCount   int64
	SkippedCount int64
	MissedCount  int64
	// LastError says why the last fire started no run; empty after one that did.
	LastError string
	// BufferedFireTime is a fire waiting for the previous run (OverlapBufferOne).
	BufferedFireTime time.Time
	CreateTime       time.Time
	UpdateTime       time.Time
}

func durationOrNil(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

func durationOf(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}

func (d ScheduleDefinition) parts() (*pb.ScheduleSpec, *pb.ScheduleAction, error) {
	input, err := toValue(d.Input)
	if err != nil {
		return nil, nil, fmt.Errorf("composer: encode schedule input: %w", err)
	}
	if d.Input == nil {
		input = nil
	}
	spec := &pb.ScheduleSpec{Cron: d.Spec.Cron, TimeZone: d.Spec.TimeZone, Interval: durationOrNil(d.Spec.Interval)}
	action := &pb.ScheduleAction{
		WorkflowName: d.Workflow, Version: int32(d.Version), Input: input, Labels: d.Labels,
	}
	return spec, action, nil
}

func scheduleFrom(s *pb.Schedule) *Schedule {
	if s == nil {
		return nil
	}
	out := &Schedule{
		ID: s.GetScheduleId(), Namespace: s.GetNamespace(),
		Spec: ScheduleSpec{
			Cron: s.GetSpec().GetCron(), TimeZone: s.GetSpec().GetTimeZone(),
			Interval: durationOf(s.GetSpec().GetInterval()),
		},
		Action: ScheduleAction{
			Workflow: s.GetAction().GetWorkflowName(), Version: int(s.GetAction().GetVersion()),
			Input: rawJSON(s.GetAction().GetInput()), Labels: s.GetAction().GetLabels(),
		},
		OverlapPolicy: OverlapPolicy(s.GetOverlapPolicy()), CatchUpWindow: durationOf(s.GetCatchUpWindow()),
		Jitter: durationOf(s.GetJitter()), Paused: s.GetPaused(), Note: s.GetNote(),
		FiredCount: s.GetFiredCount(), SkippedCount: s.GetSkippedCount(), MissedCount: s.GetMissedCount(),
		LastError: s.GetLastError(), BufferedFireTime: toTime(s.GetBufferedFireTime()),
		CreateTime: toTime(s.GetCreateTime()), UpdateTime: toTime(s.GetUpdateTime()),
	}
	for _, f := range s.GetRecentFires() {
		out.RecentFires = append(out.RecentFires, fireFrom(f))
	}
	for _, t := range s.GetNextFireTimes() {
		out.NextFireTimes = append(out.NextFireTimes, toTime(t))
	}
	return out
}

func fireFrom(f *pb.ScheduleFire) ScheduleFire {
	return ScheduleFire{FireTime: toTime(f.GetFireTime()), RunID: f.GetRunId(), Outcome: FireOutcome(f.GetOutcome())}
}

// CreateSchedule creates the schedule id that starts runs of def.Workflow on
// def.Spec. Each fire's run carries an idempotency key of the schedule and
// the fire time, so one fire starts one run however many servers run.
// INVALID_ARGUMENT with a field violation naming the field (spec.cron,
// spec.time_zone, spec.interval, action.input...); NOT_FOUND when the
// workflow (or version) does not exist; ALREADY_EXISTS when the id is taken.
func (c *Client) CreateSchedule(ctx context.Context, id string, def ScheduleDefinition) (*Schedule, error) {
	spec, action, err := def.parts()
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.schedules.CreateSchedule(ctx, &pb.CreateScheduleRequest{
		ScheduleId: id, Spec: spec, Action: action, OverlapPolicy: pb.OverlapPolicy(def.OverlapPolicy),
		CatchUpWindow: durationOrNil(def.CatchUpWindow), Jitter: durationOrNil(def.Jitter),
		Paused: def.Paused, Note: def.Note,
	}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return scheduleFrom(r.GetSchedule()), nil
}

// GetSchedule returns a schedule with its recent fires, next fire times and
// counters. NOT_FOUND when it does not exist.
func (c *Client) GetSchedule(ctx context.Context, id string) (*Schedule, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.schedules.GetSchedule(ctx, &pb.GetScheduleRequest{ScheduleId: id}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return scheduleFrom(r.GetSchedule()), nil
}

// ListSchedules iterates over the namespace's schedules by id, fetching
// pageSize at a time (0: 100). Iteration stops at the first error, which it
// yields.
func (c *Client) ListSchedules(ctx context.Context, pageSize int) iter.Seq2[*Schedule, error] {
	return paged(ctx, c, func(ctx context.Context, token string) ([]*Schedule, string, error) {
		r, err := c.schedules.ListSchedules(ctx, &pb.ListSchedulesRequest{PageSize: int32(pageSize), PageToken: token}, waitForReady)
		return convertAll(r.GetSchedules(), scheduleFrom), r.GetNextPageToken(), err
	})
}

// UpdateSchedule replaces a schedule's spec, action, overlap policy,
// catch-up window and jitter, checked as CreateSchedule checks them
// (def.Paused and def.Note are ignored: pausing stays as it was). Counters
// and recent fires stay; the next fire time is computed anew from now and a
// buffered fire is dropped. NOT_FOUND when it does not exist.
func (c *Client) UpdateSchedule(ctx context.Context, id string, def ScheduleDefinition) (*Schedule, error) {
	spec, action, err := def.parts()
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.schedules.UpdateSchedule(ctx, &pb.UpdateScheduleRequest{
		ScheduleId: id, Spec: spec, Action: action, OverlapPolicy: pb.OverlapPolicy(def.OverlapPolicy),
		CatchUpWindow: durationOrNil(def.CatchUpWindow), Jitter: durationOrNil(def.Jitter),
	}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return scheduleFrom(r.GetSchedule()), nil
}

// PauseSchedule stops a schedule's fires until ResumeSchedule, keeping note
// (why). Pausing a paused schedule only replaces the note.
func (c *Client) PauseSchedule(ctx context.Context, id, note string) (*Schedule, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.schedules.PauseSchedule(ctx, &pb.PauseScheduleRequest{ScheduleId: id, Note: note}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return scheduleFrom(r.GetSchedule()), nil
}

// ResumeSchedule lets a paused schedule fire again from its first fire time
// after now: fires that fell in the pause are neither started nor counted
// as missed.
func (c *Client) ResumeSchedule(ctx context.Context, id, note string) (*Schedule, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.schedules.ResumeSchedule(ctx, &pb.ResumeScheduleRequest{ScheduleId: id, Note: note}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return scheduleFrom(r.GetSchedule()), nil
}

// DeleteSchedule deletes a schedule; the runs it started stay. NOT_FOUND
// when it does not exist.
func (c *Client) DeleteSchedule(ctx context.Context, id string) error {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	_, err := c.schedules.DeleteSchedule(ctx, &pb.DeleteScheduleRequest{ScheduleId: id}, waitForReady)
	return convertError(err)
}

// TriggerSchedule fires a schedule now, paused or not, under its overlap
// policy, and returns the fire. A fire whose run could not start has outcome
// FireFailed and the reason in the schedule's LastError.
func (c *Client) TriggerSchedule(ctx context.Context, id string) (*ScheduleFire, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.schedules.TriggerSchedule(ctx, &pb.TriggerScheduleRequest{ScheduleId: id}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	fire := fireFrom(r.GetFire())
	return &fire, nil
}
