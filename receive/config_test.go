package receive

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/phonehome/phonehome/limits"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "receiver.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestLoadConfigDefaults(t *testing.T) {
	cfg, err := LoadConfig("")
	require.NoError(t, err)
	require.Equal(t, IDMismatchReject, cfg.Auth.IDMismatch)

	cfg, err = LoadConfig(writeConfig(t, "auth:\n  tokens_file: tokens.yaml\nlimits:\n  defaults:\n    max_body_bytes: 1MiB\nallowlist: ['up']\n"))
	require.NoError(t, err)
	require.True(t, filepath.IsAbs(cfg.Auth.TokensFile), "relative to the config file")
	require.EqualValues(t, 1<<20, limits.New(nil, cfg.Limits, nil).For("any").MaxBodyBytes)

	_, err = LoadConfig(writeConfig(t, ""))
	require.NoError(t, err, "an empty file is all defaults")

	// Telemeter's token cache: unset (0) is the default, never "off".
	cfg, err = LoadConfig(writeConfig(t, "auth:\n  telemeter:\n    token_cache_ttl: 0s\n    token_cache_size: 0\n  cluster_id_hash:\n    secret_file: key\n"))
	require.NoError(t, err)
	require.Equal(t, 5*time.Minute, time.Duration(cfg.Auth.Telemeter.TokenCacheTTL))
	require.Equal(t, 30*time.Second, time.Duration(cfg.Auth.Telemeter.TokenCacheNegativeTTL))
	require.Equal(t, 100_000, cfg.Auth.Telemeter.TokenCacheSize)
	require.True(t, filepath.IsAbs(cfg.Auth.ClusterIDHash.SecretFile), "relative to the config file")
	require.Equal(t, PseudonymsAccept, cfg.Auth.ClusterIDHash.Pseudonyms, "forwarders send pseudonyms")
	refusing, err := LoadConfig(writeConfig(t, "auth:\n  cluster_id_hash:\n    secret_file: key\n    pseudonyms: refuse\n"))
	require.NoError(t, err)
	require.Equal(t, PseudonymsRefuse, refusing.Auth.ClusterIDHash.Pseudonyms)

	// Telemeter's paths: prometheus_replica unless set; "" turns it off.
	require.Equal(t, TelemeterOptions{ReplicaLabel: "prometheus_replica", ReplicaFailover: 2 * time.Minute}, cfg.Telemeter.Options())
	cfg, err = LoadConfig(writeConfig(t, "telemeter:\n  replica_label: ''\n  replica_failover_timeout: 5m\n"))
	require.NoError(t, err)
	require.Equal(t, TelemeterOptions{ReplicaFailover: 5 * time.Minute}, cfg.Telemeter.Options())
}

func TestLoadConfigNamesEveryProblem(t *testing.T) {
	_, err := LoadConfig(writeConfig(t, "auth:\n  tokenz_file: x\n"))
	require.ErrorContains(t, err, "auth.tokenz_file: line 2: unknown key")

	// Every decoding problem, by YAML path and line, not only the first.
	bad := writeConfig(t, "storage:\n  out_of_order_window: 6hours\nlimits:\n  defaults:\n    max_serie_per_cluster: 5\n    max_body_bytes: 8Mb\n")
	_, err = LoadConfig(bad)
	require.EqualError(t, err, "parse "+bad+": "+
		"storage.out_of_order_window: line 2: want a duration such as 30s, 5m or 1h30m, found a string\n"+
		"limits.defaults.max_serie_per_cluster: line 5: unknown key\n"+
		"limits.defaults.max_body_bytes: line 6: want a byte size such as 512KiB or 8MiB, found a string")

	_, err = LoadConfig(writeConfig(t, "limits:\n  defaults:\n    max_body_bytes: 64MiB\n    max_decoded_bytes: 1MiB\n    max_label_name_length: -1\nallowlist: ['up{', 'ok']\nelide_labels: [__name__, 'a-b']\nauth:\n  id_mismatch: ignore\n  telemeter: {token_cache_ttl: 2h, token_cache_negative_ttl: 2h, token_cache_size: -1}\n  cluster_id_hash: {pseudonyms: deny}\ntelemeter: {replica_label: a-b, replica_failover_timeout: 500ms}\n"))
	for _, want := range []string{
		"limits.defaults.max_decoded_bytes",
		"limits.defaults.max_label_name_length",
		`allowlist: allowlist[0] "up{"`,
		`elide_labels[0]: "__name__" cannot be elided`,
		`elide_labels[1]: "a-b" is not a label name`,
		`auth.id_mismatch: "ignore"`,
		"auth.telemeter.token_cache_ttl: 2h",
		"auth.telemeter.token_cache_negative_ttl: 2h",
		"auth.telemeter.token_cache_size: -1",
		"auth.cluster_id_hash.secret_file: required",
		`auth.cluster_id_hash.pseudonyms: "deny", want accept or refuse`,
		`telemeter.replica_label: "a-b"`,
		"telemeter.replica_failover_timeout: 500ms",
	} {
		require.ErrorContains(t, err, want)
	}

	// Files the config names exist (--check-config), relative to the config.
	body := "upstream:\n  url: http://up:9/api/v1/write\n  bearer_token_file: up-token\nrules:\n  files: [rules.yaml]\n  alertmanagers:\n  - url: http://am:9093\n    bearer_token_file: am-token\n"
	_, err = LoadConfig(writeConfig(t, body))
	require.ErrorContains(t, err, "upstream.bearer_token_file: stat ")
	require.ErrorContains(t, err, "rules.alertmanagers[0].bearer_token_file: stat ")
	p := writeConfig(t, body)
	for _, f := range []string{"up-token", "am-token", "rules.yaml"} {
		require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(p), f), []byte("t\n"), 0o600))
	}
	_, err = LoadConfig(p)
	require.NoError(t, err)

	_, err = LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"))
	require.ErrorContains(t, err, "read config")
}

// TestLoadConfigExpandsExternalLabels: storage.external_labels values take
// ${NAME} from the environment ($$ is a literal $) before validation; an
// unset or empty variable is a config error naming the key and the variable.
func TestLoadConfigExpandsExternalLabels(t *testing.T) {
	t.Setenv("PHONEHOME_TEST_POD", "phonehome-receiver-1")
	t.Setenv("PHONEHOME_TEST_EMPTY", "")
	cfg, err := LoadConfig(writeConfig(t, "storage:\n  external_labels:\n    replica: ${PHONEHOME_TEST_POD}\n    cost: $$5\n"))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"replica": "phonehome-receiver-1", "cost": "$5"}, cfg.Storage.ExternalLabels)

	_, err = LoadConfig(writeConfig(t, "storage:\n  external_labels:\n    replica: ${PHONEHOME_TEST_UNSET}\n    zone: x${PHONEHOME_TEST_EMPTY}\n    tenant_id: t\n"))
	require.ErrorContains(t, err, "storage.external_labels.replica: ${PHONEHOME_TEST_UNSET}: environment variable PHONEHOME_TEST_UNSET is not set")
	require.ErrorContains(t, err, "storage.external_labels.zone: ${PHONEHOME_TEST_EMPTY}: environment variable PHONEHOME_TEST_EMPTY is empty")
	require.ErrorContains(t, err, "storage.external_labels.tenant_id: reserved", "with every other problem")
}

// TestLoadConfigChoosesTheEvaluator: replicas that share one configuration
// (replica: ${POD_NAME}, rules.evaluator_replica) evaluate the rules on the
// named replica only; evaluator_replica beside rules.evaluate, or without a
// replica label, is refused.
func TestLoadConfigChoosesTheEvaluator(t *testing.T) {
	shared := writeConfig(t, "storage:\n  external_labels: {replica: '${PHONEHOME_TEST_POD}'}\nrules:\n  files: [rules/*.yaml]\n  evaluator_replica: phonehome-receiver-0\n")
	for pod, evaluates := range map[string]bool{"phonehome-receiver-0": true, "phonehome-receiver-1": false} {
		t.Setenv("PHONEHOME_TEST_POD", pod)
		cfg, err := LoadConfig(shared)
		require.NoError(t, err)
		require.Equal(t, pod, cfg.Storage.ExternalLabels["replica"])
		require.Equal(t, evaluates, cfg.Rules.Evaluates(), pod)
	}

	_, err := LoadConfig(writeConfig(t, "storage:\n  external_labels: {replica: r0}\nrules:\n  files: [rules/*.yaml]\n  evaluate: true\n  evaluator_replica: r0\n"))
	require.ErrorContains(t, err, "rules.evaluator_replica: set together with rules.evaluate")
	_, err = LoadConfig(writeConfig(t, "storage:\n  external_labels: {zone: z}\nrules:\n  files: [rules/*.yaml]\n  evaluator_replica: r0\n"))
	require.ErrorContains(t, err, "storage.external_labels.replica is not set")
}
