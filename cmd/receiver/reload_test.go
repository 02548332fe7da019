package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// POST /-/reload runs every reload, also after one failed (README: it
// re-reads --config.file and the gathering definitions), and answers 500
// with the count README shows, never the reason; 200 when all succeeded.
func TestReloadHandlerRunsEveryReload(t *testing.T) {
	var ran []int
	reload := func(i int, err error) func() error {
		return func() error { ran = append(ran, i); return err }
	}
	secret := errors.New("tenants/other/gathering.yaml: line 3")

	rec := httptest.NewRecorder()
	reloadHandler([]func() error{reload(0, secret), reload(1, nil)}).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/-/reload", nil))
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	require.Contains(t, rec.Body.String(), "failed to reload: 1 of 2 reloads kept the running version")
	require.NotContains(t, rec.Body.String(), secret.Error())
	require.Equal(t, []int{0, 1}, ran, "the second reload runs after the first failed")

	ran = nil
	rec = httptest.NewRecorder()
	reloadHandler([]func() error{reload(0, nil), reload(1, nil)}).ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/-/reload", nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, []int{0, 1}, ran)
}
