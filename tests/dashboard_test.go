package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// dashboardFile is the Grafana dashboard this test keeps honest.
const dashboardFile = "../deploy/grafana/pdlb.json"

// notYetExported lists the names the dashboard queries before the gateway
// exports them, with what will export them. The test fails once one of
// them is exported, so the entry is removed and the name checked like the
// rest.
var notYetExported = map[string]string{}

// grafanaPanel is the part of a Grafana panel the test reads; rows nest
// their panels when collapsed.
type grafanaPanel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDashboard struct {
	Title      string         `json:"title"`
	UID        string         `json:"uid"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// metricName matches the series names pdlb's dashboard queries: the
// gateway's, the token ledger's and the engines'.
var metricName = regexp.MustCompile(`\b(?:pdlb_|pd_token_load_|vllm:|sglang:)[A-Za-z0-9_:]*`)

// readDashboard parses the dashboard and returns its PromQL expressions by
// where they appear ("panel 3 \"title\" A", "variable model").
func readDashboard(t *testing.T) (map[string]string, grafanaDashboard) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" {
		t.Fatalf("%s: no title or uid", dashboardFile)
	}
	exprs := map[string]string{}
	ids := map[int]bool{}
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v outside Grafana's 24 columns", p.Title, p.GridPos)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				exprs[fmt.Sprintf("panel %d %q %s", p.ID, p.Title, q.RefID)] = q.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			exprs["variable "+v.Name] = v.Definition
		}
	}
	return exprs, d
}

// exported returns the series names of an exposition.
func exported(expositions ...[]byte) map[string]bool {
	names := map[string]bool{}
	for _, e := range expositions {
		for _, line := range strings.Split(string(e), "\n") {
			if line == "" || line[0] == '#' {
				continue
			}
			if i := strings.IndexAny(line, "{ "); i > 0 {
				names[line[:i]] = true
			}
		}
	}
	return names
}

// Every name the dashboard queries is one a live gateway (or, for the
// engine row, a simulated vLLM or SGLang pod) exports, or is listed in
// notYetExported.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	exprs, _ := readDashboard(t)

	s, v, sg := everySeriesGateway(t)
	gateway := exported(fetch(t, "http://"+s.AdminAddr()+"/metrics"))
	engine := exported(fetch(t, "http://"+v.Addr()+"/metrics"), fetch(t, "http://"+sg.Addr()+"/metrics"))

	queried := map[string]bool{}
	for where, expr := range exprs {
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: %q queries no pdlb, ledger or engine series", where, expr)
		}
		for _, name := range names {
			queried[name] = true
			engineName := strings.HasPrefix(name, "vllm:") || strings.HasPrefix(name, "sglang:")
			switch {
			case !engineName && gateway[name], engineName && engine[name]:
			case notYetExported[name] != "":
			default:
				t.Errorf("%s: %s is not exported (expression %q)", where, name, expr)
			}
		}
	}
	var pending []string
	for name, why := range notYetExported {
		if gateway[name] {
			t.Errorf("%s is exported now: remove it from notYetExported", name)
		}
		if !queried[name] {
			t.Errorf("%s is in notYetExported but no panel queries it", name)
		}
		pending = append(pending, name+" ("+why+")")
	}
	sort.Strings(pending)
	t.Logf("%d expressions checked; queried but not exported yet: %s", len(exprs), strings.Join(pending, "; "))
}

// Every expression is valid PromQL: promtool parses them as recording
// rules, with Grafana's variables replaced by what they expand to.
func TestDashboardQueriesParse(t *testing.T) {
	bin := lookTool(t, "promtool", "install Debian's prometheus package (make test-deps does) to parse the dashboard's PromQL")
	exprs, _ := readDashboard(t)
	grafanaVars := strings.NewReplacer("$__rate_interval", "5m", "$model", ".*", "$pod", ".*")
	keys := make([]string, 0, len(exprs))
	for k := range exprs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var rules strings.Builder
	rules.WriteString("groups:\n- name: dashboard\n  rules:\n")
	for i, k := range keys {
		expr := exprs[k]
		if strings.HasPrefix(k, "variable ") {
			// label_values(metric, label) is Grafana's, not PromQL; its
			// first argument is the selector Grafana sends.
			expr = strings.TrimSuffix(strings.TrimPrefix(expr, "label_values("), ")")
			expr, _, _ = strings.Cut(expr, ",")
		}
		quoted, _ := json.Marshal(grafanaVars.Replace(expr))
		fmt.Fprintf(&rules, "  - record: dashboard:expr_%d\n    expr: %s\n", i, quoted)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules on the dashboard's expressions: %v\n%s\n%s", err, out, rules.String())
	}
}
