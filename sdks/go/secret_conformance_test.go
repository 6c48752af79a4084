package composer_test

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	composer "github.com/composer-dev/composer/sdks/go"
	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// secretsToken mints a token of a namespace of the test's own: its list
// holds only what the test sets.
func secretsToken(t *testing.T, subject, namespace string, roles ...string) string {
	t.Helper()
	token, err := mintToken(subject, namespace, roles...)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func listSecrets(t *testing.T, c *composer.Client, pageSize int) []composer.Secret {
	t.Helper()
	var out []composer.Secret
	for s, err := range c.ListSecrets(testContext(t, 30*time.Second), pageSize) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, *s)
	}
	return out
}

// A secret is set (version 1), set again (version 2), listed with version 2
// and no value anywhere in the answer, deleted, and then NOT_FOUND; a bad
// name is INVALID_ARGUMENT naming `name`.
func TestSecretsAreSetListedWithoutTheirValueAndDeleted(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 120*time.Second)
	subject := "ops-" + n
	client := dial(t, addr, composer.WithToken(secretsToken(t, subject, "secrets-"+n, "operator")))
	name := "stripe-key-" + n
	value := "sk_live_" + n + "_" + strings.Repeat("x", 16)

	first, err := client.SetSecret(ctx, name, []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	if first.Name != name || first.Version != 1 || first.UpdatedBy != subject || first.CreateTime.IsZero() || first.UpdateTime.IsZero() {
		t.Errorf("the first set answered %+v", *first)
	}
	second, err := client.SetSecret(ctx, name, []byte(value+"-rotated"))
	if err != nil {
		t.Fatal(err)
	}
	if second.Name != name || second.Version != 2 || !second.CreateTime.Equal(first.CreateTime) || second.UpdateTime.Before(first.UpdateTime) {
		t.Errorf("the second set answered %+v after %+v", *second, *first)
	}

	listed := listSecrets(t, client, 1)
	if len(listed) != 1 || listed[0] != *second {
		t.Errorf("listed %+v, want [%+v]", listed, *second)
	}
	// The answer on the wire, unknown fields and all, carries no value.
	raw := pb.NewSecretServiceClient(client.Conn())
	answer, err := raw.ListSecrets(client.OutgoingContext(ctx), &pb.ListSecretsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wire, err := proto.Marshal(answer)
	if err != nil {
		t.Fatal(err)
	}
	if len(answer.GetSecrets()) != 1 || bytes.Contains(wire, []byte(value)) || strings.Contains(fmt.Sprintf("%+v", listed), value) {
		t.Errorf("the list answer shows the value or is not one secret: %v", answer)
	}

	if err := client.DeleteSecret(ctx, name); err != nil {
		t.Fatal(err)
	}
	if left := listSecrets(t, client, 0); len(left) != 0 {
		t.Errorf("after the delete the list holds %+v", left)
	}
	if err := client.DeleteSecret(ctx, name); !composer.IsNotFound(err) {
		t.Errorf("a second delete: %v, want NOT_FOUND", err)
	}

	_, err = client.SetSecret(ctx, "not a name!", []byte(value))
	if fields := violationFields(t, err); !slices.Contains(fields, "name") {
		t.Errorf("a bad name: violations of %v, want name", fields)
	}
	if strings.Contains(err.Error(), value) {
		t.Errorf("the error shows the value: %v", err)
	}
	_, err = client.SetSecret(ctx, name, nil)
	if fields := violationFields(t, err); !slices.Contains(fields, "value") {
		t.Errorf("an empty value: violations of %v, want value", fields)
	}

	log, err := os.ReadFile(session.server.logPath)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(log, []byte(value)) {
		t.Error("the server logged the value")
	}
}

// A reader may not touch the namespace's secrets, and another namespace
// sees none of them.
func TestSecretsRefuseAReaderAndStayInTheirNamespace(t *testing.T) {
	addr := sharedServer(t)
	n := names()
	ctx := testContext(t, 60*time.Second)
	namespace, name := "secrets-"+n, "db-password-"+n
	operator := dial(t, addr, composer.WithToken(secretsToken(t, "ops", namespace, "operator")))
	if _, err := operator.SetSecret(ctx, name, []byte("hunter2")); err != nil {
		t.Fatal(err)
	}

	reader := dial(t, addr, composer.WithToken(secretsToken(t, "viewer", namespace, "reader")))
	if _, err := reader.SetSecret(ctx, name, []byte("overwritten")); !composer.IsPermissionDenied(err) {
		t.Errorf("a reader's set: %v, want PERMISSION_DENIED", err)
	}
	for _, err := range reader.ListSecrets(ctx, 0) {
		if !composer.IsPermissionDenied(err) {
			t.Errorf("a reader's list: %v, want PERMISSION_DENIED", err)
		}
	}
	if err := reader.DeleteSecret(ctx, name); !composer.IsPermissionDenied(err) {
		t.Errorf("a reader's delete: %v, want PERMISSION_DENIED", err)
	}

	elsewhere := dial(t, addr, composer.WithToken(secretsToken(t, "ops", "other-"+n, "operator")))
	if got := listSecrets(t, elsewhere, 0); len(got) != 0 {
		t.Errorf("another namespace lists %+v", got)
	}
	if err := elsewhere.DeleteSecret(ctx, name); !composer.IsNotFound(err) {
		t.Errorf("another namespace's delete: %v, want NOT_FOUND", err)
	}
	if got := listSecrets(t, operator, 0); len(got) != 1 || got[0].Name != name || got[0].Version != 1 {
		t.Errorf("the namespace lists %+v after the refused calls", got)
	}
}

// A server given no secrets key answers FAILED_PRECONDITION.
func TestSecretsNeedTheServersKey(t *testing.T) {
	s := keylessServer(t)
	n := names()
	client := dial(t, s.address(), composer.WithToken(secretsToken(t, "ops", "keyless-"+n, "operator")))
	_, err := client.SetSecret(testContext(t, 30*time.Second), "k-"+n, []byte("value"))
	if !composer.IsFailedPrecondition(err) {
		t.Errorf("set on a server without a key: %v, want FAILED_PRECONDITION", err)
	}
}
