package composer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/codes"

	pb "github.com/composer-dev/composer/sdks/go/gen/composer/v1"
)

// Presigned URLs (conformance item C24). When the server's ServerInfo says
// BlobURLs (its blob store is a bucket that signs URLs), UploadBlob and
// DownloadBlob move the bytes straight to and from the store:
//
//   - an upload is StartBlobUpload, one HTTP PUT of the bytes to its URL,
//     then FinishBlobUpload, whose BlobRef is the reference;
//   - a download is GetBlobUrl, then one HTTP GET of its URL.
//
// A URL call answered FAILED_PRECONDITION (the server stopped giving URLs)
// turns them off for the Client: its streams (the UploadBlob and
// DownloadBlob RPCs) carry every blob from then on. An HTTP request that
// fails (the store unreachable from here, an answer other than 2xx, bytes
// that are not the blob) sends that one call through the stream. Other
// answers of the URL calls are the call's error (NOT_FOUND stays
// NOT_FOUND). A URL is a credential for its lifetime: it is never logged
// nor put in an error.

// blobHTTP makes the requests to presigned URLs.
var blobHTTP = &http.Client{}

// blobURLState is the Client's part of C24: whether the server stopped
// giving URLs.
type blobURLState struct {
	// noBlobURLs is set once a URL call was answered FAILED_PRECONDITION.
	noBlobURLs atomic.Bool
}

// cachedServerInfo is the Client's last ServerInfo, asked once when there
// is none. A server without ServerService (UNIMPLEMENTED) reads as one
// that offloads nothing and gives no URLs.
func (c *Client) cachedServerInfo(ctx context.Context) (*ServerInfo, error) {
	c.infoMu.Lock()
	info := c.info
	c.infoMu.Unlock()
	if info != nil {
		return info, nil
	}
	info, err := c.ServerInfo(ctx)
	if IsUnimplemented(err) {
		info = &ServerInfo{}
		c.remember(info)
	} else if err != nil {
		return nil, err
	}
	return info, nil
}

// blobURLs reports whether blobs go through presigned URLs: the server
// says BlobURLs and no URL call was refused since. When the server cannot
// be asked, the stream is used (and meets the same server).
func (c *Client) blobURLs(ctx context.Context) bool {
	if c.noBlobURLs.Load() {
		return false
	}
	info, err := c.cachedServerInfo(ctx)
	return err == nil && info.BlobURLs
}

// refusedURLs reports whether err is a URL call's refusal (FAILED_PRECONDITION:
// the server gives no URLs; UNIMPLEMENTED: it has no such call) and, when
// it is, turns URLs off for the Client.
func (c *Client) refusedURLs(err error) bool {
	if code := Code(err); code != codes.FailedPrecondition && code != codes.Unimplemented {
		return false
	}
	if c.noBlobURLs.CompareAndSwap(false, true) {
		c.logger.Info("composer: the server gives no blob URLs; blobs go through its streams from now on", "error", err)
	}
	return true
}

// uploadThroughURL is UploadBlob through a presigned URL. done is false
// when the stream must carry this upload instead (the server refused the
// URL calls, or the PUT failed).
func (c *Client) uploadThroughURL(ctx context.Context, data []byte) (ref BlobRef, done bool, err error) {
	upload, err := unaryBlobCall(ctx, c, func(ctx context.Context) (*pb.StartBlobUploadResponse, error) {
		return c.blobs.StartBlobUpload(ctx, &pb.StartBlobUploadRequest{}, waitForReady)
	})
	if err != nil {
		if c.refusedURLs(err) {
			return BlobRef{}, false, nil
		}
		return BlobRef{}, true, err
	}
	if err := c.putBlob(ctx, upload.GetUrl(), data); err != nil {
		if ctx.Err() == nil { // else the stream ends at once, saying why
			c.logger.Warn("composer: the blob store could not be reached through a URL; uploading through the server's stream", "bytes", len(data), "error", err)
		}
		return BlobRef{}, false, nil
	}
	finished, err := unaryBlobCall(ctx, c, func(ctx context.Context) (*pb.FinishBlobUploadResponse, error) {
		return c.blobs.FinishBlobUpload(ctx, &pb.FinishBlobUploadRequest{UploadId: upload.GetUploadId()}, waitForReady)
	})
	if err != nil {
		if c.refusedURLs(err) {
			return BlobRef{}, false, nil
		}
		return BlobRef{}, true, err
	}
	b := finished.GetBlob()
	ref = BlobRef{SHA256: b.GetSha256(), Size: b.GetSize(), Head: b.GetHead()}
	if sum := sha256.Sum256(data); ref.SHA256 != hex.EncodeToString(sum[:]) || ref.Size != int64(len(data)) {
		// What reached the store is not what was sent: the stream carries it.
		c.logger.Warn("composer: the blob store kept other bytes than those PUT to its URL; uploading through the server's stream", "bytes", len(data), "stored_size", ref.Size)
		return BlobRef{}, false, nil
	}
	return ref, true, nil
}

// downloadThroughURL is DownloadBlob through a presigned URL, the bytes
// checked against sha. done is false when the stream must carry this
// download instead (the server refused the URL calls, or the GET failed or
// gave other bytes).
func (c *Client) downloadThroughURL(ctx context.Context, sha string) (data []byte, done bool, err error) {
	blob, err := unaryBlobCall(ctx, c, func(ctx context.Context) (*pb.GetBlobUrlResponse, error) {
		return c.blobs.GetBlobUrl(ctx, &pb.GetBlobUrlRequest{Sha256: sha}, waitForReady)
	})
	if err != nil {
		if c.refusedURLs(err) {
			return nil, false, nil
		}
		return nil, true, err // NOT_FOUND stays NOT_FOUND
	}
	data, err = c.getBlob(ctx, blob.GetUrl(), blob.GetSize())
	if err == nil {
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != sha {
			err = fmt.Errorf("got %d bytes (of %d) with another SHA-256", len(data), blob.GetSize())
		}
	}
	if err != nil {
		if ctx.Err() == nil { // else the stream ends at once, saying why
			c.logger.Warn("composer: the blob store could not be read through a URL; downloading through the server's stream", "sha256", sha, "error", err)
		}
		return nil, false, nil
	}
	return data, true, nil
}

// unaryBlobCall makes one URL call of BlobService with the token and the
// Client's default timeout; errors are converted.
func unaryBlobCall[T any](ctx context.Context, c *Client, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	r, err := call(ctx)
	if err != nil {
		var zero T
		return zero, convertError(err)
	}
	return r, nil
}

// putBlob sends data to a presigned URL with one HTTP PUT (Content-Length
// set). The Client's timeout bounds each wait for the store, as for a
// stream. The error never holds the URL.
func (c *Client) putBlob(ctx context.Context, target string, data []byte) error {
	ctx, progress, cancel := c.watchdog(ctx)
	defer cancel()
	var body io.Reader = http.NoBody
	if len(data) > 0 {
		body = &progressReader{r: bytes.NewReader(data), progress: progress}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, body)
	if err != nil {
		return errors.New("the URL is malformed")
	}
	req.ContentLength = int64(len(data))
	req.GetBody = func() (io.ReadCloser, error) { // for a redirect
		return io.NopCloser(&progressReader{r: bytes.NewReader(data), progress: progress}), nil
	}
	// Azure's Put Blob needs it; S3 and GCS ignore it.
	req.Header.Set("x-ms-blob-type", "BlockBlob")
	resp, err := blobHTTP.Do(req)
	if err != nil {
		return httpError(ctx, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("the store answered the PUT with %s", resp.Status)
	}
	return nil
}

// getBlob reads a presigned URL with one HTTP GET: size bytes are expected
// (more are not read). The Client's timeout bounds each wait for the
// store. The error never holds the URL.
func (c *Client) getBlob(ctx context.Context, target string, size int64) ([]byte, error) {
	ctx, progress, cancel := c.watchdog(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, errors.New("the URL is malformed")
	}
	resp, err := blobHTTP.Do(req)
	if err != nil {
		return nil, httpError(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("the store answered the GET with %s", resp.Status)
	}
	progress()
	// Trust the announced size for the allocation only up to 1 GiB.
	buf := bytes.NewBuffer(make([]byte, 0, min(max(size, 0), 1<<30)))
	if _, err := buf.ReadFrom(io.LimitReader(&progressReader{r: resp.Body, progress: progress}, max(size, 0)+1)); err != nil {
		return nil, httpError(ctx, err)
	}
	if int64(buf.Len()) != size {
		return nil, fmt.Errorf("the store sent %d bytes of %d", buf.Len(), size)
	}
	return buf.Bytes(), nil
}

// httpError is err of an HTTP request without the URL (a *url.Error
// names it, signature and all); a request ended by the watchdog says so.
func httpError(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), errStreamSilent) {
		return errors.New("the store sent or took nothing within the client's timeout")
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", strings.ToUpper(ue.Op), ue.Err)
	}
	return err
}

// progressReader calls progress after each read that got bytes.
type progressReader struct {
	r        io.Reader
	progress func()
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.progress()
	}
	return n, err
}
