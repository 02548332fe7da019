package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// --help names the erase subcommand beside the flags.
func TestHelpNamesTheEraseSubcommand(t *testing.T) {
	var stderr bytes.Buffer
	run([]string{"--help"}, &stderr)
	require.Contains(t, stderr.String(), "receiver erase [flags]")
	require.Contains(t, stderr.String(), "-config.file")
}
