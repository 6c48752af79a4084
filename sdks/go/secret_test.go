package composer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// secretValue is the value the tests set; it must show up nowhere but in
// the request on the wire.
const secretValue = "s3cr3t-Value-that-must-stay-hidden"

var secretNameRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// fakeSecrets is a SecretService on a loopback port that keeps each
// secret's version and times (never its value), records every request, and
// refuses as the server does: a bad name or an empty value naming the
// field, an unknown name NOT_FOUND, no key FAILED_PRECONDITION, a reader's
// token PERMISSION_DENIED.
type fakeSecrets struct {
	pb.UnimplementedSecretServiceServer

	mu       sync.Mutex
	requests []proto.Message
	secrets  map[string]*pb.Secret
	noKey    bool
}

func startFakeSecrets(t *testing.T, opts ...Option) (*fakeSecrets, *Client) {
	t.Helper()
	f := &fakeSecrets{secrets: map[string]*pb.Secret{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterSecretServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	client, err := Dial(context.Background(), lis.Addr().String(), append([]Option{WithToken("operator")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.Close()
		srv.Stop()
	})
	return f, client
}

func invalidField(field, description string) error {
	st, _ := status.New(codes.InvalidArgument, "invalid "+field).WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: description}},
	})
	return st.Err()
}

// refuse records the request and says whether the server would refuse it.
func (f *fakeSecrets) refuse(ctx context.Context, req proto.Message, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	md, _ := metadata.FromIncomingContext(ctx)
	if slices.Contains(md.Get("authorization"), "Bearer reader") {
		return status.Error(codes.PermissionDenied, "role reader may not call SecretService")
	}
	if f.noKey {
		return status.Error(codes.FailedPrecondition, "this server has no secrets key-encryption key")
	}
	if _, isList := req.(*pb.ListSecretsRequest); !isList && !secretNameRule.MatchString(name) {
		return invalidField("name", "must be 1 to 64 characters from A-Z a-z 0-9 _ . -")
	}
	return nil
}

func (f *fakeSecrets) recorded() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

func (f *fakeSecrets) SetSecret(ctx context.Context, req *pb.SetSecretRequest) (*pb.SetSecretResponse, error) {
	if err := f.refuse(ctx, req, req.GetName()); err != nil {
		return nil, err
	}
	if len(req.GetValue()) == 0 {
		return nil, invalidField("value", "must not be empty")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.secrets[req.GetName()]
	if !ok {
		s = &pb.Secret{Name: req.GetName(), CreateTime: timestamppb.New(fakeCreated)}
		f.secrets[req.GetName()] = s
	}
	s.Version++
	s.UpdateTime, s.UpdatedBy = timestamppb.New(fakeUpdated), "ci"
	return &pb.SetSecretResponse{Secret: proto.Clone(s).(*pb.Secret)}, nil
}

// ListSecrets pages by name; a page token is the index of the page's first
// secret.
func (f *fakeSecrets) ListSecrets(ctx context.Context, req *pb.ListSecretsRequest) (*pb.ListSecretsResponse, error) {
	if err := f.refuse(ctx, req, ""); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.secrets))
	for name := range f.secrets {
		names = append(names, name)
	}
	slices.Sort(names)
	start, _ := strconv.Atoi(req.GetPageToken())
	size := int(req.GetPageSize())
	if size == 0 {
		size = 100
	}
	end := min(start+size, len(names))
	resp := &pb.ListSecretsResponse{}
	for _, name := range names[start:end] {
		resp.Secrets = append(resp.Secrets, proto.Clone(f.secrets[name]).(*pb.Secret))
	}
	if end < len(names) {
		resp.NextPageToken = strconv.Itoa(end)
	}
	return resp, nil
}

func (f *fakeSecrets) DeleteSecret(ctx context.Context, req *pb.DeleteSecretRequest) (*pb.DeleteSecretResponse, error) {
	if err := f.refuse(ctx, req, req.GetName()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.secrets[req.GetName()]; !ok {
		return nil, status.Error(codes.NotFound, "no secret "+req.GetName())
	}
	delete(f.secrets, req.GetName())
	return &pb.DeleteSecretResponse{}, nil
}

// shownNowhere fails the test when the value appears in any rendering of
// the things given (%v, %+v, %#v, and Error() for errors).
func shownNowhere(t *testing.T, what string, things ...any) {
	t.Helper()
	for _, thing := range things {
		renderings := []string{fmt.Sprintf("%v", thing), fmt.Sprintf("%+v", thing), fmt.Sprintf("%#v", thing)}
		if err, ok := thing.(error); ok {
			renderings = append(renderings, err.Error())
			var ce *Error
			if errors.As(err, &ce) {
				renderings = append(renderings, fmt.Sprintf("%#v", *ce), ce.GRPCStatus().String())
			}
		}
		for _, shown := range renderings {
			if strings.Contains(shown, secretValue) {
				t.Errorf("%s shows the value: %s", what, shown)
			}
		}
	}
}

// SetSecret sends the name and the value as given and reads the secret back
// without it; each set is a new version; DeleteSecret names the secret.
func TestSecretCallsMapTheirRequestsAndAnswers(t *testing.T) {
	f, client := startFakeSecrets(t)
	ctx := context.Background()

	first, err := client.SetSecret(ctx, "stripe-key", []byte(secretValue))
	if err != nil {
		t.Fatal(err)
	}
	want := Secret{Name: "stripe-key", Version: 1, CreateTime: fakeCreated, UpdateTime: fakeUpdated, UpdatedBy: "ci"}
	if *first != want {
		t.Errorf("set answered %+v, want %+v", *first, want)
	}
	binary := []byte{0, 0xff, 'b', 'i', 'n'}
	second, err := client.SetSecret(ctx, "stripe-key", binary)
	if err != nil {
		t.Fatal(err)
	}
	if second.Version != 2 || !second.CreateTime.Equal(fakeCreated) {
		t.Errorf("the second set answered %+v", *second)
	}
	shownNowhere(t, "a Secret", first, *first, second)
	if err := client.DeleteSecret(ctx, "stripe-key"); err != nil {
		t.Fatal(err)
	}

	wantRequests := []proto.Message{
		&pb.SetSecretRequest{Name: "stripe-key", Value: []byte(secretValue)},
		&pb.SetSecretRequest{Name: "stripe-key", Value: binary},
		&pb.DeleteSecretRequest{Name: "stripe-key"},
	}
	requests := f.recorded()
	if len(requests) != len(wantRequests) {
		t.Fatalf("%d requests, want %d", len(requests), len(wantRequests))
	}
	for i := range wantRequests {
		if !proto.Equal(requests[i], wantRequests[i]) {
			t.Errorf("request %d: %v, want %v", i, requests[i], wantRequests[i])
		}
	}
}

// ListSecrets pages with the page size and the tokens given, and stops
// fetching when the iteration stops.
func TestListSecretsPagesThroughEverySecret(t *testing.T) {
	f, client := startFakeSecrets(t)
	ctx := context.Background()
	for _, name := range []string{"s4", "s2", "s0", "s3", "s1"} {
		if _, err := client.SetSecret(ctx, name, []byte(secretValue)); err != nil {
			t.Fatal(err)
		}
	}
	f.mu.Lock()
	f.requests = nil
	f.mu.Unlock()

	var listed []string
	for s, err := range client.ListSecrets(ctx, 2) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, fmt.Sprintf("%s@%d", s.Name, s.Version))
		shownNowhere(t, "a listed Secret", s, *s)
	}
	if fmt.Sprint(listed) != "[s0@1 s1@1 s2@1 s3@1 s4@1]" {
		t.Errorf("listed %v", listed)
	}
	want := []proto.Message{
		&pb.ListSecretsRequest{PageSize: 2},
		&pb.ListSecretsRequest{PageSize: 2, PageToken: "2"},
		&pb.ListSecretsRequest{PageSize: 2, PageToken: "4"},
	}
	got := f.recorded()
	if len(got) != len(want) {
		t.Fatalf("requests %v, want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("request %d: %v, want %v", i, got[i], want[i])
		}
	}

	f.mu.Lock()
	f.requests = nil
	f.mu.Unlock()
	for range client.ListSecrets(ctx, 2) {
		break
	}
	if n := len(f.recorded()); n != 1 {
		t.Errorf("an iteration stopped on the first page made %d calls", n)
	}
}

// A refused secret call comes back as an *Error with the status's code and
// its field violations, and neither it nor the Client's log shows the value.
func TestSecretErrorsDecodeTheirStatusAndShowNoValue(t *testing.T) {
	var logged bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f, client := startFakeSecrets(t, WithLogger(logger))
	ctx := context.Background()

	s, err := client.SetSecret(ctx, "not a name!", []byte(secretValue))
	var ce *Error
	if s != nil || !errors.As(err, &ce) || !IsInvalidArgument(err) || len(ce.FieldViolations) != 1 || ce.FieldViolations[0].Field != "name" {
		t.Errorf("a bad name: %+v, %v", s, err)
	}
	shownNowhere(t, "the error of a bad name", err)
	if _, err := client.SetSecret(ctx, "empty", nil); !IsInvalidArgument(err) || !errors.As(err, &ce) || ce.FieldViolations[0].Field != "value" {
		t.Errorf("an empty value: %v", err)
	}
	if err := client.DeleteSecret(ctx, "stripe-key"); !IsNotFound(err) {
		t.Errorf("delete of a missing secret: %v", err)
	}

	f.mu.Lock()
	f.noKey = true
	f.mu.Unlock()
	_, err = client.SetSecret(ctx, "stripe-key", []byte(secretValue))
	if !IsFailedPrecondition(err) {
		t.Errorf("a server without a key: %v", err)
	}
	shownNowhere(t, "the error of a server without a key", err)
	for _, err := range client.ListSecrets(ctx, 0) {
		if !IsFailedPrecondition(err) {
			t.Errorf("list on a server without a key: %v", err)
		}
	}

	_, reader := startFakeSecrets(t, WithToken("reader"), WithLogger(logger))
	_, err = reader.SetSecret(ctx, "stripe-key", []byte(secretValue))
	if !IsPermissionDenied(err) {
		t.Errorf("a reader's set: %v", err)
	}
	shownNowhere(t, "the error of a reader's set", err)
	if err := reader.DeleteSecret(ctx, "stripe-key"); !IsPermissionDenied(err) {
		t.Errorf("a reader's delete: %v", err)
	}
	if strings.Contains(logged.String(), secretValue) {
		t.Errorf("the client logged the value: %s", logged.String())
	}
}
