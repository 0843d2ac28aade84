package serve

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/recal-project/recal/router"
)

// metrics are the server's Prometheus collectors, in a registry of their
// own (so that two servers in one process, as in tests, do not collide).
type metrics struct {
	reg          *prometheus.Registry
	requests     *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	inflight     prometheus.Gauge
	rejected     prometheus.Counter
	bodyReads    prometheus.Gauge
	bodyRefused  *prometheus.CounterVec
	poolCalls    *prometheus.CounterVec
	poolFailures *prometheus.CounterVec
	poolCost     *prometheus.CounterVec
	tokens       *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	known        map[string]bool
}

// otherModel labels calls of a model the metrics were not told about (a
// label never holds text the policy wrote: one series per typo).
const otherModel = "(unknown)"

func newMetrics(b Backend, models []string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "recal_serve_requests_total",
			Help: "HTTP requests by endpoint and status code (499: the client went away)."}, []string{"handler", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "recal_serve_request_duration_seconds",
			Help: "HTTP request latency by endpoint, queueing included.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 16)}, []string{"handler"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "recal_serve_requests_in_flight",
			Help: "HTTP requests being handled."}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "recal_serve_rejected_total",
			Help: "Chat requests answered 429 because max_batch + max_queue requests were in flight."}),
		bodyReads: prometheus.NewGauge(prometheus.GaugeOpts{Name: "recal_serve_body_reads",
			Help: "Chat request bodies being read (at most serve.max_body_reads)."}),
		bodyRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "recal_serve_body_refused_total",
			Help: "Chat requests whose body was not read in full: busy (503, max_body_reads bodies were being read) or timeout (408, slower than body_timeout)."}, []string{"reason"}),
		poolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "recal_serve_pool_calls_total",
			Help: "Pool calls made for answered requests, by pool model."}, []string{"model"}),
		poolFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "recal_serve_pool_failures_total",
			Help: "Pool calls that got no reply, by pool model."}, []string{"model"}),
		poolCost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "recal_serve_pool_cost_usd_total",
			Help: "Cost of the pool calls at list prices (USD), by pool model."}, []string{"model"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "recal_serve_tokens_total",
			Help: "Tokens of answered requests: policy_prompt, policy_completion, pool_prompt, pool_completion."}, []string{"kind"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "recal_serve_search_refusals_total",
			Help: "<search> actions that made no pool call: unknown_model (not a model the request may call) or budget (recal.max_cost_usd spent)."}, []string{"reason"}),
		known: map[string]bool{},
	}
	queue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "recal_serve_queue_depth",
		Help: "Requests waiting for a decoding row."}, func() float64 { _, w := b.Stats(); return float64(w) })
	batch := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "recal_serve_batch_rows",
		Help: "Requests decoding together (rows of the policy's batch)."}, func() float64 { a, _ := b.Stats(); return float64(a) })
	m.reg.MustRegister(m.requests, m.latency, m.inflight, m.rejected, m.bodyReads, m.bodyRefused, m.poolCalls, m.poolFailures, m.poolCost, m.tokens, m.refusals, queue, batch,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.bodyRefused.WithLabelValues("busy")
	m.bodyRefused.WithLabelValues("timeout")
	for _, name := range append(models, otherModel) {
		m.known[name] = true
		m.poolCalls.WithLabelValues(name)
		m.poolFailures.WithLabelValues(name)
		m.poolCost.WithLabelValues(name)
	}
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

func (m *metrics) observe(route string, status int, d time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}

// answered counts an answered request's tokens (its pool calls were
// counted as they arrived).
func (m *metrics) answered(res Result) {
	_, ru := usageOf(res)
	m.tokens.WithLabelValues("policy_prompt").Add(float64(ru.PolicyPromptTokens))
	m.tokens.WithLabelValues("policy_completion").Add(float64(ru.PolicyCompletionTokens))
	m.tokens.WithLabelValues("pool_prompt").Add(float64(ru.PoolPromptTokens))
	m.tokens.WithLabelValues("pool_completion").Add(float64(ru.PoolCompletionTokens))
}

// call counts one pool call, as soon as its reply arrives (a request
// cancelled later still spent it). A <search> that made no call (an
// unknown model, a spent budget) counts as a refusal, not a call.
func (m *metrics) call(c router.Call) {
	switch {
	case c.Unknown:
		m.refusals.WithLabelValues("unknown_model").Inc()
		return
	case c.Refused:
		m.refusals.WithLabelValues("budget").Inc()
		return
	}
	model := c.Model
	if !m.known[model] {
		model = otherModel
	}
	m.poolCalls.WithLabelValues(model).Inc()
	if c.Failed {
		m.poolFailures.WithLabelValues(model).Inc()
	}
	m.poolCost.WithLabelValues(model).Add(c.Cost)
}
