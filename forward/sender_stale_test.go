package forward

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/atomicfile"
)

// A forwarder killed while writing its remote-write state leaves a
// temporary file: the next sender removes it, and the state still loads.
func TestHTTPSenderRemovesTemporaryStateFilesOfACrash(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "remote-write-version.json")
	u := mustURL(t, "http://127.0.0.1:1")
	b, err := json.Marshal(protoState{Endpoint: NewHTTPSender(u, http.DefaultClient, HTTPSenderOptions{}).url, Protocol: ProtoV1, Since: time.Now()})
	require.NoError(t, err)
	require.NoError(t, atomicfile.Write(state, b, 0o600))
	_, err = atomicfile.Prepare(state, []byte("torn"), 0o600)
	require.NoError(t, err)

	s := NewHTTPSender(u, http.DefaultClient, HTTPSenderOptions{StateFile: state})
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only the state file is left")
	require.Equal(t, ProtoV1, s.current(), "the state file is untouched")
}
