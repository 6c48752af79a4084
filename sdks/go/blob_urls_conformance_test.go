package composer_test

// C24 (tests/conformance/README.md): presigned URLs move blobs straight to
// and from the store. A server of the test's own keeps its blobs in a
// bucket of moto (a real S3 API, .tools/moto/bin/moto_server, installed by
// scripts/setup.sh; COMPOSER_TEST_MOTO_SERVER names another) and serves
// /metrics: C23's runs through it give C23's results, and the server
// counted FinishBlobUpload and GetBlobUrl calls and no UploadBlob or
// DownloadBlob call. The fallbacks (FAILED_PRECONDITION, a failed HTTP
// request) are proved against the fake server in blob_test.go.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

func motoBinary() string {
	if b := os.Getenv("COMPOSER_TEST_MOTO_SERVER"); b != "" {
		return b
	}
	return filepath.Join(repoRoot, ".tools", "moto", "bin", "moto_server")
}

// freePort is a loopback port nothing listens on (now).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startMoto starts moto's S3 server on a free loopback port and makes
// bucket (a PUT of /<bucket>, which also tells moto answers); it returns
// the endpoint, http://127.0.0.1:<port>. moto stops when the test ends.
func startMoto(t *testing.T, bucket string) string {
	t.Helper()
	bin := motoBinary()
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("%s is missing: run scripts/setup.sh (it installs moto, the S3 API of this test)", bin)
		if os.Getenv("COMPOSER_REQUIRE_SERVER") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	port := freePort(t)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "moto.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodPut, endpoint+"/"+bucket, nil)
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return endpoint
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logFile.Name())
			t.Fatalf("moto exited; its log:\n%s", log)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("moto did not make bucket %s within 30 s", bucket)
		}
	}
}

// grpcRequests reads /metrics at base and returns composer_grpc_requests_total
// summed by method (e.g. "/composer.v1.BlobService/GetBlobUrl"), over
// every status code.
func grpcRequests(t *testing.T, base string) map[string]float64 {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	method := regexp.MustCompile(`[{,]method="([^"]*)"`)
	counts := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "composer_grpc_requests_total{") {
			continue
		}
		m := method.FindStringSubmatch(line)
		fields := strings.Fields(line)
		value, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if m == nil || err != nil {
			t.Fatalf("a sample of composer_grpc_requests_total not understood: %s", line)
		}
		counts[m[1]] += value
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return counts
}

// C23's runs against a server whose blobs are in a moto bucket give C23's
// results, and the server counted FinishBlobUpload and GetBlobUrl calls
// and no UploadBlob or DownloadBlob call.
func TestC24PresignedURLsMoveBlobsStraightToAndFromTheStore(t *testing.T) {
	services(t)
	bucket := "composer-go-" + names()
	endpoint := startMoto(t, bucket)
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := &serverProcess{
		logPath:   filepath.Join(t.TempDir(), "blob-urls-server.log"),
		blobStore: "s3://" + bucket + "/composer",
		extraArgs: []string{
			"--blob-store-option", "aws_endpoint=" + endpoint,
			"--blob-store-option", "aws_allow_http=true",
			"--blob-store-option", "aws_access_key_id=test",
			"--blob-store-option", "aws_secret_access_key=test",
			"--blob-store-option", "aws_region=us-east-1",
			"--blob-store-option", "aws_virtual_hosted_style_request=false",
			"--metrics-listen", metrics,
		},
	}
	if err := s.start(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	addr := s.address()

	info, err := dial(t, addr).ServerInfo(testContext(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !info.BlobURLs {
		t.Fatalf("the server's blob store is a bucket, but it gives no blob URLs: %+v", info)
	}

	t.Run("run", func(t *testing.T) { largePayloadRun(t, addr) })
	t.Run("event", func(t *testing.T) { largeEventPayload(t, addr) })

	counts := grpcRequests(t, "http://"+metrics)
	const blobService = "/composer.v1.BlobService/"
	blobCalls := map[string]float64{}
	for method, n := range counts {
		if strings.HasPrefix(method, blobService) {
			blobCalls[strings.TrimPrefix(method, blobService)] = n
		}
	}
	t.Logf("BlobService calls the server counted: %v", blobCalls)
	for _, method := range []string{"StartBlobUpload", "FinishBlobUpload", "GetBlobUrl"} {
		if counts[blobService+method] <= 0 {
			t.Errorf("the server counted no %s call: %v", method, counts)
		}
	}
	for _, method := range []string{"UploadBlob", "DownloadBlob"} {
		if n := counts[blobService+method]; n > 0 {
			t.Errorf("the server counted %v %s calls, want none: the bytes went through it", n, method)
		}
	}
	if t.Failed() {
		log, _ := os.ReadFile(s.logPath)
		if len(log) > 4000 {
			log = log[len(log)-4000:]
		}
		t.Logf("the server's log (its end):\n%s", log)
	}
}
