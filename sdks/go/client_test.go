package composer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// fakeCatalog is a WorkflowService and RunService on a loopback port that
// pages workflows and versions and counts runs, recording each request.
type fakeCatalog struct {
	pb.UnimplementedWorkflowServiceServer
	pb.UnimplementedRunServiceServer

	mu       sync.Mutex
	requests []proto.Message
}

func startFakeCatalog(t *testing.T) (*fakeCatalog, *Client) {
	t.Helper()
	f := &fakeCatalog{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterWorkflowServiceServer(srv, f)
	pb.RegisterRunServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	client, err := Dial(context.Background(), "http://"+lis.Addr().String(), WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.Close()
		srv.Stop()
	})
	return f, client
}

func (f *fakeCatalog) record(req proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
}

// ListWorkflows answers two pages: "a" then "b".
func (f *fakeCatalog) ListWorkflows(_ context.Context, req *pb.ListWorkflowsRequest) (*pb.ListWorkflowsResponse, error) {
	f.record(req)
	if req.GetPageToken() == "" {
		return &pb.ListWorkflowsResponse{Workflows: []*pb.WorkflowSummary{{Namespace: "default", Name: "a", LatestVersion: 3, Description: "first", UpdateTime: timestamppb.Now()}}, NextPageToken: "p2"}, nil
	}
	return &pb.ListWorkflowsResponse{Workflows: []*pb.WorkflowSummary{{Namespace: "default", Name: "b", LatestVersion: 1}}}, nil
}

func (f *fakeCatalog) ListWorkflowVersions(_ context.Context, req *pb.ListWorkflowVersionsRequest) (*pb.ListWorkflowVersionsResponse, error) {
	f.record(req)
	if req.GetName() != "order" {
		return nil, status.Errorf(codes.NotFound, "workflow %q not found", req.GetName())
	}
	if req.GetPageToken() == "" {
		return &pb.ListWorkflowVersionsResponse{Versions: []*pb.WorkflowVersion{{Name: "order", Version: 2}}, NextPageToken: "p2"}, nil
	}
	return &pb.ListWorkflowVersionsResponse{Versions: []*pb.WorkflowVersion{{Name: "order", Version: 1}}}, nil
}

func (f *fakeCatalog) CountRuns(_ context.Context, req *pb.CountRunsRequest) (*pb.CountRunsResponse, error) {
	f.record(req)
	return &pb.CountRunsResponse{Counts: []*pb.RunStatusCount{
		{Status: pb.RunStatus_RUN_STATUS_RUNNING, Count: 4},
		{Status: pb.RunStatus_RUN_STATUS_COMPLETED, Count: 10},
		{Status: pb.RunStatus_RUN_STATUS_FAILED, Count: 2},
	}, More: true}, nil
}

func (f *fakeCatalog) recorded() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.requests...)
}

func TestListWorkflowsPagesThroughSummaries(t *testing.T) {
	f, client := startFakeCatalog(t)
	var names []string
	for w, err := range client.ListWorkflows(context.Background(), ListWorkflowsOptions{NamePrefix: "o", PageSize: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, fmt.Sprintf("%s@%d", w.Name, w.LatestVersion))
		if w.Name == "a" && (w.Description != "first" || w.UpdateTime.IsZero() || w.Namespace != "default") {
			t.Errorf("summary %+v", w)
		}
	}
	if strings.Join(names, ",") != "a@3,b@1" {
		t.Errorf("workflows %v", names)
	}
	reqs := f.recorded()
	first := reqs[0].(*pb.ListWorkflowsRequest)
	second := reqs[1].(*pb.ListWorkflowsRequest)
	if len(reqs) != 2 || first.GetNamePrefix() != "o" || first.GetPageSize() != 1 || second.GetPageToken() != "p2" || second.GetNamePrefix() != "o" {
		t.Errorf("requests %v", reqs)
	}
}

func TestListWorkflowVersionsNewestFirstAndNotFound(t *testing.T) {
	_, client := startFakeCatalog(t)
	var versions []int
	for v, err := range client.ListWorkflowVersions(context.Background(), "order", 0) {
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, v.Version)
	}
	if fmt.Sprint(versions) != "[2 1]" {
		t.Errorf("versions %v", versions)
	}
	for _, err := range client.ListWorkflowVersions(context.Background(), "nope", 0) {
		if !IsNotFound(err) {
			t.Errorf("unknown workflow: %v", err)
		}
	}
}

func TestCountRunsByStatus(t *testing.T) {
	f, client := startFakeCatalog(t)
	counts, err := client.CountRuns(context.Background(), RunFilter{Workflow: "order", Labels: map[string]string{"shop": "eu"}, Search: "A-"})
	if err != nil {
		t.Fatal(err)
	}
	if counts.ByStatus[RunRunning] != 4 || counts.ByStatus[RunCompleted] != 10 || counts.ByStatus[RunFailed] != 2 || counts.ByStatus[RunCancelled] != 0 || counts.Total() != 16 || !counts.More {
		t.Errorf("counts %v", counts)
	}
	req := f.recorded()[0].(*pb.CountRunsRequest)
	if req.GetWorkflowName() != "order" || req.GetLabels()["shop"] != "eu" || req.GetSearch() != "A-" {
		t.Errorf("request %v", req)
	}
	failed, err := client.CountRuns(context.Background(), RunFilter{Statuses: []RunStatus{RunFailed, RunCancelled}})
	if err != nil || len(failed.ByStatus) != 1 || failed.ByStatus[RunFailed] != 2 || failed.Total() != 2 {
		t.Errorf("counts of FAILED and CANCELLED: %v, %v", failed, err)
	}
}

type declinedError struct{}

func (declinedError) Error() string { return "declined" }

// A handler's error that names no type of its own is ERROR; an error a
// program declared (anywhere in the chain) is its type.
func TestDefaultErrorCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		code string
	}{
		{errors.New("boom"), "ERROR"},
		{fmt.Errorf("charging: %w", errors.New("reset")), "ERROR"},
		{errors.Join(errors.New("a"), errors.New("b")), "ERROR"},
		{fmt.Errorf("no %d", 3), "ERROR"},
		{context.Canceled, "ERROR"},
		{&fs.PathError{Op: "open", Path: "x", Err: fs.ErrNotExist}, "fs.PathError"},
		{fmt.Errorf("reading: %w", &fs.PathError{Op: "open", Path: "x", Err: fs.ErrNotExist}), "fs.PathError"},
		{declinedError{}, "composer.declinedError"},
		{fmt.Errorf("charge: %w", declinedError{}), "composer.declinedError"},
	} {
		if got := errorCode(c.err); got != c.code {
			t.Errorf("errorCode(%T %v) = %s, want %s", c.err, c.err, got, c.code)
		}
	}
}

// A run that ended CANCELLED carries the cancel's code and reason.
func TestRunFailedErrorCarriesTheCancelReason(t *testing.T) {
	cancelled := &RunFailedError{Run: &Run{ID: "r1", Status: RunCancelled, Error: &Failure{Code: "CANCELLED", Message: "customer asked"}}}
	if cancelled.Code() != "CANCELLED" || cancelled.Message() != "customer asked" || cancelled.Error() != "run r1 ended CANCELLED: CANCELLED: customer asked" {
		t.Errorf("cancelled: %s / %s / %s", cancelled.Code(), cancelled.Message(), cancelled)
	}
	bare := &RunFailedError{Run: &Run{ID: "r2", Status: RunCancelled}}
	if bare.Code() != "CANCELLED" || bare.Error() != "run r2 ended CANCELLED: CANCELLED" {
		t.Errorf("cancelled without an error: %s", bare)
	}
	failed := &RunFailedError{Run: &Run{ID: "r3", Status: RunFailed, Error: &Failure{Code: "DECLINED", Message: "card", NodeID: "charge"}}}
	if failed.Code() != "DECLINED" || failed.Error() != "run r3 ended FAILED: DECLINED: card (node charge)" {
		t.Errorf("failed: %s", failed)
	}
}
