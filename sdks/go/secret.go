package composer

import (
	"context"
	"iter"
	"time"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// Secret describes one of the namespace's secrets, the credentials HTTP and
// CODE nodes use as ${secrets.NAME} (docs/secrets.md). It never holds the
// value: no call returns one.
type Secret struct {
	// Name is the secret's name, as ${secrets.NAME} refers to it.
	Name string
	// Version is the current version: 1 for the first value, one more for
	// each SetSecret since.
	Version int
	// CreateTime is when the first version was set, UpdateTime when the
	// current one was.
	CreateTime time.Time
	UpdateTime time.Time
	// UpdatedBy is the subject of the token that set the current version.
	UpdatedBy string
}

func secretFrom(s *pb.Secret) *Secret {
	if s == nil {
		return nil
	}
	return &Secret{
		Name: s.GetName(), Version: int(s.GetVersion()),
		CreateTime: toTime(s.GetCreateTime()), UpdateTime: toTime(s.GetUpdateTime()),
		UpdatedBy: s.GetUpdatedBy(),
	}
}

// SetSecret stores value as a new version of the secret name and returns the
// secret, without its value: version 1 at first, one more at each set; a
// run's node uses the version current when it executes. A string s goes as
// []byte(s). The value is 1 byte to 64 KiB; no call returns it, the Client
// neither logs it nor puts it in an error, and keeps no reference to it after
// the call (a unary interceptor added with WithUnaryInterceptor sees the
// request: one that logs requests would log the value).
//
// INVALID_ARGUMENT with a field violation naming name (the name rule,
// docs/names.md) or value (empty or too long); RESOURCE_EXHAUSTED when the
// namespace holds 1,000 secrets and name is new; FAILED_PRECONDITION when
// the server was given no secrets key (--secrets-key-file);
// PERMISSION_DENIED unless the token is an operator's or an admin's.
func (c *Client) SetSecret(ctx context.Context, name string, value []byte) (*Secret, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := c.secrets.SetSecret(ctx, &pb.SetSecretRequest{Name: name, Value: value}, waitForReady)
	if err != nil {
		return nil, convertError(err)
	}
	return secretFrom(r.GetSecret()), nil
}

// ListSecrets iterates over the namespace's secrets by name (names,
// versions and times, never values), fetching pageSize at a time (0: 100;
// at most 1,000). Iteration stops at the first error, which it yields.
func (c *Client) ListSecrets(ctx context.Context, pageSize int) iter.Seq2[*Secret, error] {
	return paged(ctx, c, func(ctx context.Context, token string) ([]*Secret, string, error) {
		r, err := c.secrets.ListSecrets(ctx, &pb.ListSecretsRequest{PageSize: int32(pageSize), PageToken: token}, waitForReady)
		return convertAll(r.GetSecrets(), secretFrom), r.GetNextPageToken(), err
	})
}

// DeleteSecret removes a secret and every version of it: a node that names
// it afterwards fails with SECRET_NOT_FOUND. NOT_FOUND when there is none.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	_, err := c.secrets.DeleteSecret(ctx, &pb.DeleteSecretRequest{Name: name}, waitForReady)
	return convertError(err)
}
