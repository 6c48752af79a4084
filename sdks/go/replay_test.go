package composer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// The recorded run every SDK and the CLI replay: order v1 (A → B → C), A
// completed with {"amount": 30}, B running.
var recordedFixture = filepath.Join("..", "..", "tests", "fixtures", "replay", "order-waiting-in-b.history.json")

// fakeReplay is a WorkflowService on a loopback port that answers ReplayRun
// from a script and CheckWorkflowVersion from a number of runs, recording
// every request.
type fakeReplay struct {
	pb.UnimplementedWorkflowServiceServer

	mu       sync.Mutex
	requests []proto.Message
	// replay answers ReplayRun.
	replay *pb.RunReplay
	// inFlight is the number of runs CheckWorkflowVersion pages through:
	// run i is identical, but every third one compatible and every fifth
	// incompatible (a multiple of 15 counts incompatible).
	inFlight int
	// failPage, when positive, makes the page starting at that offset fail.
	failPage int
}

func startFakeReplay(t *testing.T) (*fakeReplay, *Client) {
	t.Helper()
	f := &fakeReplay{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterWorkflowServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	client, err := Dial(context.Background(), lis.Addr().String(), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.Close()
		srv.Stop()
	})
	return f, client
}

func (f *fakeReplay) recorded() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.requests...)
}

func (f *fakeReplay) ReplayRun(_ context.Context, req *pb.ReplayRunRequest) (*pb.ReplayRunResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	return &pb.ReplayRunResponse{Replay: f.replay}, nil
}

// CheckWorkflowVersion pages by offset: the token is the first run's index.
func (f *fakeReplay) CheckWorkflowVersion(_ context.Context, req *pb.CheckWorkflowVersionRequest) (*pb.CheckWorkflowVersionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	offset := 0
	if req.GetPageToken() != "" {
		n, err := strconv.Atoi(req.GetPageToken())
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, "page_token: bad token")
		}
		offset = n
	}
	if f.failPage > 0 && offset == f.failPage {
		return nil, status.Error(codes.Unavailable, "the server went away")
	}
	end := min(offset+int(req.GetPageSize()), f.inFlight)
	resp := &pb.CheckWorkflowVersionResponse{Checked: int32(end - offset)}
	for i := offset; i < end; i++ {
		replay := &pb.RunReplay{RunId: fmt.Sprintf("run-%d", i), WorkflowVersion: 1, Status: pb.RunStatus_RUN_STATUS_RUNNING}
		switch {
		case i%5 == 0:
			resp.Incompatible++
			replay.Verdict = pb.ReplayVerdict_REPLAY_VERDICT_INCOMPATIBLE
			replay.Divergence = &pb.ReplayDivergence{Rule: "node_changed", NodeId: "B", Sequence: 4, Message: "B's task is another"}
		case i%3 == 0:
			resp.Compatible++
			replay.Verdict = pb.ReplayVerdict_REPLAY_VERDICT_COMPATIBLE
		default:
			resp.Identical++
			continue
		}
		resp.Runs = append(resp.Runs, replay)
	}
	if end < f.inFlight {
		resp.NextPageToken = strconv.Itoa(end)
	}
	return resp, nil
}

// ReplayRun of a run named by id sends the id, the new definition's text
// and the renames, and reads the verdict with its divergence.
func TestReplayRunByIDSendsTheRunAndTheNewDefinition(t *testing.T) {
	f, client := startFakeReplay(t)
	f.replay = &pb.RunReplay{
		RunId: "run-1", WorkflowVersion: 1, Status: pb.RunStatus_RUN_STATUS_RUNNING,
		Verdict: pb.ReplayVerdict_REPLAY_VERDICT_INCOMPATIBLE, Events: 3,
		Divergence: &pb.ReplayDivergence{Rule: "node_changed", NodeId: "B", Sequence: 4, Message: "task b became b2"},
	}
	source := "name: order\nnodes: []\n"
	replay, err := client.ReplayRun(context.Background(), RunByID("run-1"), ReplayOptions{
		Source: YAML([]byte(source)), NodeMapping: map[string]string{"B": "B2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := &RunReplay{
		RunID: "run-1", WorkflowVersion: 1, Status: RunRunning, Verdict: ReplayIncompatible, Events: 3,
		Divergence: &ReplayDivergence{Rule: "node_changed", NodeID: "B", Sequence: 4, Message: "task b became b2"},
	}
	if !reflect.DeepEqual(replay, want) {
		t.Errorf("replay %+v, want %+v", replay, want)
	}
	if replay.Verdict.String() != "INCOMPATIBLE" {
		t.Errorf("verdict name %q", replay.Verdict)
	}
	sent := &pb.ReplayRunRequest{
		Recorded: &pb.ReplayRunRequest_RunId{RunId: "run-1"}, Source: source, NodeMapping: map[string]string{"B": "B2"},
	}
	if got := f.recorded(); len(got) != 1 || !proto.Equal(got[0], sent) {
		t.Errorf("requests %v, want %v", got, sent)
	}
}

// A registered version is sent as the version, with no text; a compatible
// verdict carries its differences.
func TestReplayRunAgainstARegisteredVersion(t *testing.T) {
	f, client := startFakeReplay(t)
	f.replay = &pb.RunReplay{
		RunId: "run-2", Verdict: pb.ReplayVerdict_REPLAY_VERDICT_COMPATIBLE,
		Differences: []*pb.ReplayDifference{{Kind: "node_added", NodeId: "D", Message: "D is new"}},
	}
	replay, err := client.ReplayRun(context.Background(), RunByID("run-2"), ReplayOptions{Version: 3})
	if err != nil {
		t.Fatal(err)
	}
	if replay.Verdict != ReplayCompatible || replay.Divergence != nil ||
		fmt.Sprint(replay.Differences) != fmt.Sprint([]ReplayDifference{{Kind: "node_added", NodeID: "D", Message: "D is new"}}) {
		t.Errorf("replay %+v", replay)
	}
	sent := &pb.ReplayRunRequest{Recorded: &pb.ReplayRunRequest_RunId{RunId: "run-2"}, Version: 3}
	if got := f.recorded(); len(got) != 1 || !proto.Equal(got[0], sent) {
		t.Errorf("requests %v, want %v", got, sent)
	}
}

// The file `composer run history -o json` wrote parses into the run, its
// definition and its history, and ReplayRun sends it whole.
func TestReplayRunOfARecordedRunSendsItWhole(t *testing.T) {
	data, err := os.ReadFile(recordedFixture)
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := ParseRecordedRun(data)
	if err != nil {
		t.Fatal(err)
	}
	run, workflow, events := recorded.Run(), recorded.Workflow(), recorded.Events()
	if run.ID != "01a24a4f-f8a8-72a9-b54a-0bca93fd712a" || run.Status != RunRunning || run.Workflow != "order" ||
		run.WorkflowVersion != 1 || string(run.Node("A").Output) != `{"amount":30}` || run.Node("B").Status != NodeRunning {
		t.Errorf("run %+v", run)
	}
	if workflow.Name != "order" || workflow.Version != 1 || !strings.Contains(workflow.Source, "task: c") {
		t.Errorf("workflow %+v", workflow)
	}
	var types []string
	for _, e := range events {
		types = append(types, e.EventType+":"+e.NodeID)
	}
	if strings.Join(types, ",") != "run_started:,node_started:A,node_completed:A,node_started:B" {
		t.Errorf("events %v", types)
	}

	f, client := startFakeReplay(t)
	f.replay = &pb.RunReplay{RunId: run.ID, Verdict: pb.ReplayVerdict_REPLAY_VERDICT_IDENTICAL, Events: 2}
	replay, err := client.ReplayRun(context.Background(), recorded, ReplayOptions{Version: 2})
	if err != nil {
		t.Fatal(err)
	}
	if replay.RunID != run.ID || replay.Verdict != ReplayIdentical || replay.Events != 2 {
		t.Errorf("replay %+v", replay)
	}
	got := f.recorded()
	if len(got) != 1 {
		t.Fatalf("requests %v", got)
	}
	req := got[0].(*pb.ReplayRunRequest)
	history := req.GetHistory()
	if req.GetRunId() != "" || req.GetVersion() != 2 || req.GetSource() != "" ||
		history.GetRun().GetRunId() != run.ID || history.GetWorkflow().GetSource() != workflow.Source ||
		len(history.GetEvents()) != 4 || history.GetEvents()[2].GetDetails().GetStructValue().GetFields()["worker_id"].GetStringValue() != "test-worker-1" ||
		history.GetRun().GetNodes()[0].GetOutput().GetStructValue().GetFields()["amount"].GetNumberValue() != 30 {
		t.Errorf("sent %v", req)
	}
}

// A file that is not a whole recorded run is refused, saying what is missing.
func TestParseRecordedRunRefusesAnIncompleteFile(t *testing.T) {
	data, err := os.ReadFile(recordedFixture)
	if err != nil {
		t.Fatal(err)
	}
	cut := strings.Replace(string(data), `"next_page_token": ""`, `"next_page_token": "4"`, 1)
	if cut == string(data) {
		t.Fatal("the fixture has no next_page_token to set")
	}
	for _, c := range []struct{ name, text, says string }{
		{"not JSON", "run: x", "not a JSON object"},
		{"cut short", cut, "cut short"},
		{"no run", `{"workflow": {"source": "name: x"}, "events": [{"event_type": "run_started"}]}`, `no "run"`},
		{"no source", `{"run": {"run_id": "r"}, "workflow": {"name": "x"}, "events": [{"event_type": "run_started"}]}`, `no "workflow"`},
		{"no events", `{"run": {"run_id": "r"}, "workflow": {"source": "name: x"}, "events": []}`, `no "events"`},
		{"a field of the wrong type", `{"run": {"run_id": 7}, "workflow": {"source": "name: x"}, "events": []}`, "invalid value for string field"},
	} {
		if _, err := ParseRecordedRun([]byte(c.text)); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.says)
		}
	}
	// Keys the API does not know (a newer CLI's) are ignored.
	extra := strings.Replace(string(data), `"next_page_token": ""`, `"next_page_token": "", "written_by": "composer 9"`, 1)
	if _, err := ParseRecordedRun([]byte(extra)); err != nil {
		t.Errorf("an unknown key: %v", err)
	}
}

// Bad arguments are INVALID_ARGUMENT naming the field, and nothing is sent.
func TestReplayArgumentsAreCheckedBeforeAnyCall(t *testing.T) {
	f, client := startFakeReplay(t)
	ctx := context.Background()
	var nilRecorded *RecordedRun
	def := YAML([]byte("name: order\n"))
	for _, c := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"no run", func() error { _, err := client.ReplayRun(ctx, nil, ReplayOptions{Version: 2}); return err }, "run_id"},
		{"an empty run id", func() error { _, err := client.ReplayRun(ctx, RunByID(""), ReplayOptions{Version: 2}); return err }, "run_id"},
		{"a nil recorded run", func() error { _, err := client.ReplayRun(ctx, nilRecorded, ReplayOptions{Version: 2}); return err }, "history"},
		{"neither source nor version", func() error { _, err := client.ReplayRun(ctx, RunByID("r"), ReplayOptions{}); return err }, "source"},
		{"both source and version", func() error {
			_, err := client.ReplayRun(ctx, RunByID("r"), ReplayOptions{Source: def, Version: 2})
			return err
		}, "version"},
		{"a negative version", func() error { _, err := client.ReplayRun(ctx, RunByID("r"), ReplayOptions{Version: -1}); return err }, "version"},
		{"an empty source", func() error {
			_, err := client.ReplayRun(ctx, RunByID("r"), ReplayOptions{Source: YAML([]byte(" \n"))})
			return err
		}, "source"},
		{"an empty new id", func() error {
			_, err := client.ReplayRun(ctx, RunByID("r"), ReplayOptions{Version: 2, NodeMapping: map[string]string{"B": ""}})
			return err
		}, "node_mapping"},
		{"a check without a name", func() error {
			_, err := client.CheckWorkflowVersion(ctx, "", CheckWorkflowVersionOptions{Version: 2})
			return err
		}, "name"},
		{"a check with both", func() error {
			_, err := client.CheckWorkflowVersion(ctx, "order", CheckWorkflowVersionOptions{Source: def, Version: 2})
			return err
		}, "version"},
		{"a check with neither", func() error {
			_, err := client.CheckWorkflowVersion(ctx, "order", CheckWorkflowVersionOptions{})
			return err
		}, "source"},
		{"a limit on the runs in flight", func() error {
			_, err := client.CheckWorkflowVersion(ctx, "order", CheckWorkflowVersionOptions{Version: 2, Limit: 10})
			return err
		}, "limit"},
		{"a negative limit", func() error {
			_, err := client.CheckWorkflowVersion(ctx, "order", CheckWorkflowVersionOptions{Version: 2, Scope: CheckCompleted, Limit: -1})
			return err
		}, "limit"},
		{"an unknown scope", func() error {
			_, err := client.CheckWorkflowVersion(ctx, "order", CheckWorkflowVersionOptions{Version: 2, Scope: 9})
			return err
		}, "scope"},
		{"a negative page size", func() error {
			_, err := client.CheckWorkflowVersion(ctx, "order", CheckWorkflowVersionOptions{Version: 2, PageSize: -1})
			return err
		}, "page_size"},
	} {
		err := c.call()
		var ce *Error
		if !errors.As(err, &ce) || !IsInvalidArgument(err) || len(ce.FieldViolations) != 1 || ce.FieldViolations[0].Field != c.field {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %s", c.name, err, c.field)
		}
	}
	if got := f.recorded(); len(got) != 0 {
		t.Errorf("bad arguments reached the server: %v", got)
	}
	if _, err := client.ReplayRun(ctx, RunByID("r"), ReplayOptions{Source: File(filepath.Join(t.TempDir(), "missing.yaml"))}); err == nil || IsInvalidArgument(err) {
		t.Errorf("a definition file that does not exist: %v", err)
	}
}

// CheckWorkflowVersion fetches every page and adds their counts up, with
// every run that is not identical, sending the same request each time.
func TestCheckWorkflowVersionSumsEveryPage(t *testing.T) {
	f, client := startFakeReplay(t)
	f.inFlight = 450
	check, err := client.CheckWorkflowVersion(context.Background(), "order", CheckWorkflowVersionOptions{
		Source: YAML([]byte("name: order\n")), NodeMapping: map[string]string{"B": "B2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	// of 0..449: 90 multiples of 5 (incompatible), 120 other multiples of 3
	if check.Checked != 450 || check.Incompatible != 90 || check.Compatible != 120 || check.Identical != 240 ||
		check.Unreplayable != 0 || len(check.Runs) != 210 {
		t.Errorf("check %+v (%d runs listed)", check, len(check.Runs))
	}
	if first := check.Runs[0]; first.RunID != "run-0" || first.Verdict != ReplayIncompatible || first.Divergence.Rule != "node_changed" {
		t.Errorf("first run listed %+v", first)
	}
	if last := check.Runs[len(check.Runs)-1]; last.RunID != "run-447" || last.Verdict != ReplayCompatible {
		t.Errorf("last run listed %+v", last)
	}
	got := f.recorded()
	if len(got) != 3 {
		t.Fatalf("%d calls, want 3 pages of 200", len(got))
	}
	for i, token := range []string{"", "200", "400"} {
		want := &pb.CheckWorkflowVersionRequest{
			Name: "order", Source: "name: order\n", NodeMapping: map[string]string{"B": "B2"}, PageSize: 200, PageToken: token,
		}
		if !proto.Equal(got[i], want) {
			t.Errorf("call %d: %v, want %v", i, got[i], want)
		}
	}
}

// With a limit on the completed runs, the last page asks for what is left
// and no page past the limit is fetched.
func TestCheckWorkflowVersionStopsAtTheLimit(t *testing.T) {
	f, client := startFakeReplay(t)
	f.inFlight = 1000
	check, err := client.CheckWorkflowVersion(context.Background(), "order", CheckWorkflowVersionOptions{
		Version: 4, Scope: CheckCompleted, Limit: 250, PageSize: 100,
	})
	if err != nil {
		t.Fatal(err)
	}
	if check.Checked != 250 || check.Identical+check.Compatible+check.Incompatible+check.Unreplayable != 250 {
		t.Errorf("check %+v", check)
	}
	var sizes []string
	for _, r := range f.recorded() {
		req := r.(*pb.CheckWorkflowVersionRequest)
		if req.GetScope() != pb.CheckScope_CHECK_SCOPE_COMPLETED || req.GetVersion() != 4 || req.GetSource() != "" {
			t.Errorf("request %v", req)
		}
		sizes = append(sizes, fmt.Sprintf("%s:%d", req.GetPageToken(), req.GetPageSize()))
	}
	if strings.Join(sizes, ",") != ":100,100:100,200:50" {
		t.Errorf("pages asked (token:size) %v", sizes)
	}
}

// A page that fails fails the check: no partial sum comes back.
func TestCheckWorkflowVersionFailsOnAFailedPage(t *testing.T) {
	f, client := startFakeReplay(t)
	f.inFlight, f.failPage = 500, 200
	check, err := client.CheckWorkflowVersion(context.Background(), "order", CheckWorkflowVersionOptions{Version: 2})
	if !IsUnavailable(err) || check != nil {
		t.Errorf("check %+v, %v; want UNAVAILABLE", check, err)
	}
	if n := len(f.recorded()); n != 2 {
		t.Errorf("%d calls, want 2", n)
	}
}

// MigrateRuns sends the filter, the target, the renames and the request id
// as bulk calls do, and reads a MIGRATE operation WaitBulkOperation waits on.
func TestMigrateRunsMapsItsRequestAndAnswer(t *testing.T) {
	f, client := startFakeBulk(t)
	ctx := context.Background()
	filter := RunFilter{Workflow: "order", WorkflowVersion: 1, Labels: map[string]string{"shop": "eu"}}
	op, err := client.MigrateRuns(ctx, filter, 2, map[string]string{"B": "B2"}, WithRequestID("move-1"))
	if err != nil {
		t.Fatal(err)
	}
	if op.ID != "op-1" || op.Kind != BulkKindMigrate || op.Kind.String() != "MIGRATE" || op.Status != BulkPending ||
		!op.Created || op.TargetVersion != 2 || fmt.Sprint(op.NodeMapping) != "map[B:B2]" || op.Filter.Workflow != "order" {
		t.Errorf("migrate answered %+v", op)
	}
	f.mu.Lock()
	f.statuses = []pb.BulkOperationStatus{pb.BulkOperationStatus_BULK_OPERATION_STATUS_SUCCEEDED}
	f.mu.Unlock()
	if done, err := client.WaitBulkOperation(ctx, op.ID); err != nil || done.Status != BulkSucceeded {
		t.Errorf("waiting: %+v, %v", done, err)
	}
	want := &pb.MigrateRunsRequest{
		Filter:        &pb.RunFilter{WorkflowName: "order", WorkflowVersion: 1, Labels: map[string]string{"shop": "eu"}},
		TargetVersion: 2, NodeMapping: map[string]string{"B": "B2"}, RequestId: "move-1",
	}
	if got := f.recorded(); len(got) < 1 || !proto.Equal(got[0], want) {
		t.Errorf("requests %v, want %v first", got, want)
	}

	// Bad arguments never reach the server.
	f.mu.Lock()
	f.requests = nil
	f.mu.Unlock()
	for _, c := range []struct {
		name  string
		call  func() error
		field string
	}{
		{"no workflow", func() error { _, err := client.MigrateRuns(ctx, RunFilter{}, 2, nil); return err }, "filter.workflow_name"},
		{"no target", func() error { _, err := client.MigrateRuns(ctx, filter, 0, nil); return err }, "target_version"},
		{"all runs", func() error { _, err := client.MigrateRuns(ctx, filter, 2, nil, WithAllRuns()); return err }, "all"},
		{"an empty recorded id", func() error {
			_, err := client.MigrateRuns(ctx, filter, 2, map[string]string{"": "B2"})
			return err
		}, "node_mapping"},
	} {
		err := c.call()
		var ce *Error
		if !errors.As(err, &ce) || !IsInvalidArgument(err) || len(ce.FieldViolations) != 1 || ce.FieldViolations[0].Field != c.field {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %s", c.name, err, c.field)
		}
	}
	if got := f.recorded(); len(got) != 0 {
		t.Errorf("bad arguments reached the server: %v", got)
	}
}

func TestReplayNames(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{ReplayIdentical.String(), "IDENTICAL"},
		{ReplayCompatible.String(), "COMPATIBLE"},
		{ReplayIncompatible.String(), "INCOMPATIBLE"},
		{ReplayUnreplayable.String(), "UNREPLAYABLE"},
		{CheckInFlight.String(), "IN_FLIGHT"},
		{CheckCompleted.String(), "COMPLETED"},
	} {
		if c.got != c.want {
			t.Errorf("%q, want %q", c.got, c.want)
		}
	}
}
