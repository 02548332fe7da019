package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/internal/buildversion"
)

// --help names the erase subcommand beside the flags.
func TestHelpNamesTheEraseSubcommand(t *testing.T) {
	var stderr bytes.Buffer
	require.Equal(t, 0, run([]string{"--help"}, &stderr), "help is not an error")
	require.Contains(t, stderr.String(), "receiver erase [flags]")
	require.Contains(t, stderr.String(), "-config.file")
}

// --version names the build's version: 0.1.0 for one that names none, not
// an empty string (internal/buildversion).
func TestVersionIsNeverEmpty(t *testing.T) {
	var stderr bytes.Buffer
	require.Equal(t, 0, run([]string{"--version"}, &stderr))
	require.Contains(t, stderr.String(), "receiver, version "+buildversion.Base+" ")
}
