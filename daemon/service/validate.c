/* daemon/service/validate.c — field checks of decoded requests (see validate.h). */
#include <errno.h>
#include <string.h>

#include "ckpt.h"
#include "prefix_index.h"
#include "validate.h"

int validate_model_id(const char *s)
{
	size_t n;

	if (!s)
		return -EINVAL;
	n = strlen(s);
	if (n == 0 || n > VALIDATE_MODEL_ID_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return -EINVAL;
	return 0;
}

/* A tier a client may ask to read or write from: GPU or host (the disk
 * tier is the daemon's own). */
static int validate_read_tier(Kvpalace__V1__Tier t)
{
	return t == KVPALACE__V1__TIER__TIER_GPU || t == KVPALACE__V1__TIER__TIER_HOST;
}

int validate_key_spans(Kvpalace__V1__KeySpan *const *spans, size_t n, const char **ret_reason)
{
	if (n > PREFIX_INDEX_MAX_SPANS) {
		*ret_reason = "more than 256 key spans in one request";
		return -EMSGSIZE;
	}
	for (size_t i = 0; i < n; i++) {
		const Kvpalace__V1__KeySpan *k = spans[i];

		if (k->key.len == 0 || k->key.len > PREFIX_INDEX_MAX_KEY) {
			*ret_reason = "a key span's key is 1..64 bytes";
			return -EINVAL;
		}
		if (k->n_tokens == 0) {
			*ret_reason = "a key span covers 1 token or more";
			return -EINVAL;
		}
		if (k->first_token > VALIDATE_MAX_POSITION ||
		    k->n_tokens > VALIDATE_MAX_POSITION - k->first_token) {
			*ret_reason = "a key span ends past position 2^48";
			return -EINVAL;
		}
		if (i && k->first_token < spans[i - 1]->first_token + spans[i - 1]->n_tokens) {
			*ret_reason =
				"key spans must be sorted by first_token and must not overlap";
			return -EINVAL;
		}
	}
	return 0;
}

int validate_extra_key(int has, size_t len, const char **ret_reason)
{
	if (has && (len == 0 || len > PREFIX_INDEX_MAX_KEY)) {
		*ret_reason = "an extra key is 1..64 bytes";
		return -EINVAL;
	}
	return 0;
}

/* The wire layout's fields, unchecked; an absent format is the KV format
 * (clients older than the field). */
static struct shm_layout wire_layout(const Kvpalace__V1__Layout *in)
{
	return (struct shm_layout){
		.n_layers = in->n_layers,
		.n_kv_heads = in->n_kv_heads,
		.head_dim = in->head_dim,
		.block_tokens = in->block_tokens,
		.dtype = (uint32_t)in->dtype,
		.quant_group = in->has_quant_group ? in->quant_group : 0,
		.format = in->has_format ? in->format : 0,
	};
}

int validate_layout(const Kvpalace__V1__Layout *in, struct shm_layout *ret)
{
	struct shm_layout l = wire_layout(in);

	if (shm_layout_check(&l) < 0)
		return -EINVAL;
	*ret = l;
	return 0;
}

const char *validate_layout_why(const Kvpalace__V1__Layout *in)
{
	struct shm_layout l = wire_layout(in);

	return shm_layout_why(&l);
}

#define REJECT(err, why)                                                                           \
	do {                                                                                       \
		*ret_reason = (why);                                                               \
		return (err);                                                                      \
	} while (0)
/* A check that wrote its own reason. */
#define KEYS(call)                                                                                 \
	do {                                                                                       \
		int err_ = (call);                                                                 \
		if (err_ < 0)                                                                      \
			return err_;                                                               \
	} while (0)

int validate_request(const Kvpalace__V1__Request *req, const struct validate_limits *lim,
		     const char **ret_reason)
{
	struct shm_layout l;

	switch (req->op_case) {
	case KVPALACE__V1__REQUEST__OP_HELLO:
	case KVPALACE__V1__REQUEST__OP_CLOSE_SESSION:
	case KVPALACE__V1__REQUEST__OP_RELEASE:
	case KVPALACE__V1__REQUEST__OP_STATS:
	case KVPALACE__V1__REQUEST__OP_FORK:
	case KVPALACE__V1__REQUEST__OP_FORK_LEASE:
	case KVPALACE__V1__REQUEST__OP_TRUNCATE:
	case KVPALACE__V1__REQUEST__OP_SESSION_PAGES:
	case KVPALACE__V1__REQUEST__OP_ADOPT_LEASE:
	case KVPALACE__V1__REQUEST__OP_LEASE_PAGES:
	case KVPALACE__V1__REQUEST__OP_SUBSCRIBE_EVENTS:
	case KVPALACE__V1__REQUEST__OP_DROP_SESSION:
	case KVPALACE__V1__REQUEST__OP_DROP_POOL:
	case KVPALACE__V1__REQUEST__OP_CONFIG_SHOW:
	case KVPALACE__V1__REQUEST__OP_CONFIG_RELOAD:
		break;
	case KVPALACE__V1__REQUEST__OP_SHOW_SESSION:
		if (req->show_session->has_max_page_slots &&
		    req->show_session->max_page_slots > VALIDATE_SHOW_SLOTS_MAX)
			REJECT(-EINVAL, "more than 4096 page slots asked for");
		break;
	case KVPALACE__V1__REQUEST__OP_EVICT: {
		const Kvpalace__V1__EvictRequest *e = req->evict;

		if (e->tier != KVPALACE__V1__TIER__TIER_GPU &&
		    e->tier != KVPALACE__V1__TIER__TIER_HOST &&
		    e->tier != KVPALACE__V1__TIER__TIER_DISK)
			REJECT(-EINVAL, "unknown tier");
		if (e->has_pool_id && e->pool_id == 0)
			REJECT(-EINVAL, "pool id 0 does not exist");
		if (e->has_max_bytes && e->max_bytes == 0)
			REJECT(-EINVAL, "evict of zero bytes");
		if (e->has_max_pages && e->max_pages == 0)
			REJECT(-EINVAL, "evict of zero pages");
		break;
	}
	case KVPALACE__V1__REQUEST__OP_PURGE: {
		const Kvpalace__V1__PurgeRequest *pg = req->purge;

		if (!pg->has_pool_id && !pg->has_uid && !pg->model_id && !pg->has_cache_salt &&
		    !pg->has_unused_since_unix_s)
			REJECT(-EINVAL, "a purge names what to purge: a pool, a uid, a model, a "
					"salt or an age");
		if (pg->has_pool_id && pg->pool_id == 0)
			REJECT(-EINVAL, "pool id 0 does not exist");
		if (pg->model_id && validate_model_id(pg->model_id) < 0)
			REJECT(-EINVAL, "model id must be 1..127 printable ASCII characters");
		if (pg->has_cache_salt && pg->cache_salt.len > PREFIX_INDEX_MAX_SALT)
			REJECT(-EINVAL, "cache salt longer than 64 bytes");
		if (pg->has_extra_key && !pg->has_cache_salt)
			REJECT(-EINVAL, "a purge by extra key names the salt too");
		KEYS(validate_extra_key(pg->has_extra_key, pg->extra_key.len, ret_reason));
		break;
	}
	case KVPALACE__V1__REQUEST__OP_CREATE_SESSION:
		if (req->create_session->has_cache_salt &&
		    req->create_session->cache_salt.len > PREFIX_INDEX_MAX_SALT)
			REJECT(-EINVAL, "cache salt longer than 64 bytes");
		KEYS(validate_extra_key(req->create_session->has_extra_key,
					req->create_session->extra_key.len, ret_reason));
		break;
	case KVPALACE__V1__REQUEST__OP_OPEN_POOL:
		if (validate_model_id(req->open_pool->model_id) < 0)
			REJECT(-EINVAL, "model id must be 1..127 printable ASCII characters");
		if (validate_layout(req->open_pool->layout, &l) < 0)
			REJECT(-EINVAL, validate_layout_why(req->open_pool->layout));
		break;
	case KVPALACE__V1__REQUEST__OP_APPEND:
		if (req->append->has_tier && !validate_read_tier(req->append->tier))
			REJECT(-EINVAL, "append into an unknown tier or the disk tier");
		if (req->append->n_tokens == 0)
			REJECT(-EINVAL, "append of zero tokens");
		if (req->append->n_tokens > lim->max_tokens_per_request)
			REJECT(-EMSGSIZE, "too many tokens in one request");
		KEYS(validate_key_spans(req->append->key_spans, req->append->n_key_spans,
					ret_reason));
		if (req->append->has_summary && req->append->summary &&
		    req->append->has_permanent && !req->append->permanent)
			REJECT(-EINVAL,
			       "a summary span is permanent: summary with permanent false");
		break;
	case KVPALACE__V1__REQUEST__OP_LIST_SESSIONS:
		if (req->list_sessions->has_limit && req->list_sessions->limit == 0)
			REJECT(-EINVAL, "ListSessions limit 0: ask for 1 session or more");
		break;
	case KVPALACE__V1__REQUEST__OP_COMMIT:
		if (req->commit->n_tokens == 0)
			REJECT(-EINVAL, "commit of zero tokens");
		break;
	case KVPALACE__V1__REQUEST__OP_LOOKUP: {
		size_t total = 0;

		if (req->lookup->n_queries > VALIDATE_LOOKUP_MAX_QUERIES)
			REJECT(-EMSGSIZE, "more than 64 queries in one Lookup");
		for (size_t i = 0; i < req->lookup->n_queries; i++) {
			const Kvpalace__V1__LookupQuery *q = req->lookup->queries[i];

			if (q->tokens_le.len % 4)
				REJECT(-EINVAL, "tokens_le is not a whole number of 4-byte tokens");
			if (q->has_cache_salt && q->cache_salt.len > PREFIX_INDEX_MAX_SALT)
				REJECT(-EINVAL, "cache salt longer than 64 bytes");
			if (q->has_chain && q->chain.len != 16)
				REJECT(-EINVAL, "a lookup chain is 16 bytes");
			if (q->has_chain && q->has_cache_salt)
				REJECT(-EINVAL, "a lookup continuing a chain takes no salt");
			if (q->has_chain && q->has_extra_key)
				REJECT(-EINVAL, "a lookup continuing a chain takes no extra key");
			if (q->has_first_token && q->first_token > VALIDATE_MAX_POSITION)
				REJECT(-EINVAL, "a lookup's first_token is past position 2^48");
			KEYS(validate_extra_key(q->has_extra_key, q->extra_key.len, ret_reason));
			KEYS(validate_key_spans(q->key_spans, q->n_key_spans, ret_reason));
			total += q->tokens_le.len / 4;
		}
		if (total > lim->max_tokens_per_request)
			REJECT(-EMSGSIZE, "too many tokens in one request");
		break;
	}
	case KVPALACE__V1__REQUEST__OP_MATCH_PREFIX:
		if (req->match_prefix->has_tier && !validate_read_tier(req->match_prefix->tier))
			REJECT(-EINVAL, "match into an unknown tier or the disk tier");
		if (req->match_prefix->has_tokens_le && req->match_prefix->n_tokens)
			REJECT(-EINVAL, "tokens and tokens_le in one request");
		if (req->match_prefix->has_tokens_le && req->match_prefix->tokens_le.len % 4)
			REJECT(-EINVAL, "tokens_le is not a whole number of 4-byte tokens");
		if (validate_match_tokens(req->match_prefix) > lim->max_tokens_per_request)
			REJECT(-EMSGSIZE, "too many tokens in one request");
		if (req->match_prefix->has_lease_id && req->match_prefix->lease_id == 0)
			REJECT(-EINVAL, "lease id 0 does not exist");
		if (req->match_prefix->has_lease_id && req->match_prefix->continues)
			REJECT(-EINVAL, "a later chunk names its lease or continues, not both");
		if (req->match_prefix->continues &&
		    (req->match_prefix->has_cache_salt || req->match_prefix->has_extra_key))
			REJECT(-EINVAL, "the salt and extra key go with the first chunk only");
		if (req->match_prefix->has_prompt_tokens &&
		    (req->match_prefix->has_lease_id || req->match_prefix->continues ||
		     req->match_prefix->prompt_tokens < validate_match_tokens(req->match_prefix)))
			REJECT(-EINVAL,
			       "prompt_tokens goes with the first chunk and counts its tokens");
		if (req->match_prefix->has_prompt_tokens &&
		    req->match_prefix->prompt_tokens > lim->max_prompt_tokens)
			REJECT(-EINVAL, "prompt_tokens longer than max-session-tokens");
		if (req->match_prefix->has_cache_salt &&
		    req->match_prefix->cache_salt.len > PREFIX_INDEX_MAX_SALT)
			REJECT(-EINVAL, "cache salt longer than 64 bytes");
		if (req->match_prefix->has_extra_key && req->match_prefix->has_lease_id)
			REJECT(-EINVAL, "the extra key goes with the first chunk only");
		KEYS(validate_extra_key(req->match_prefix->has_extra_key,
					req->match_prefix->extra_key.len, ret_reason));
		KEYS(validate_key_spans(req->match_prefix->key_spans,
					req->match_prefix->n_key_spans, ret_reason));
		break;
	case KVPALACE__V1__REQUEST__OP_CHECKPOINT:
		if (!ckpt_name_valid(req->checkpoint->name))
			REJECT(-EINVAL, "checkpoint names are 1..64 of A-Z a-z 0-9 . _ -, "
					"starting with a letter, digit or _");
		break;
	case KVPALACE__V1__REQUEST__OP_RESTORE:
		if (!ckpt_name_valid(req->restore->name))
			REJECT(-EINVAL, "checkpoint names are 1..64 of A-Z a-z 0-9 . _ -, "
					"starting with a letter, digit or _");
		if (req->restore->has_pool_id && req->restore->pool_id == 0)
			REJECT(-EINVAL, "pool id 0 does not exist");
		break;
	case KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS:
		if (req->list_checkpoints->name && !ckpt_name_valid(req->list_checkpoints->name))
			REJECT(-EINVAL, "checkpoint names are 1..64 of A-Z a-z 0-9 . _ -, "
					"starting with a letter, digit or _");
		break;
	case KVPALACE__V1__REQUEST__OP_DELETE_CHECKPOINT:
		if (!ckpt_name_valid(req->delete_checkpoint->name))
			REJECT(-EINVAL, "checkpoint names are 1..64 of A-Z a-z 0-9 . _ -, "
					"starting with a letter, digit or _");
		break;
	case KVPALACE__V1__REQUEST__OP_OPEN_DEVICE_ARENA:
		break;
	case KVPALACE__V1__REQUEST__OP_LEASE_DEVICE:
		if (req->lease_device->lease_id == 0)
			REJECT(-EINVAL, "lease id 0 does not exist");
		break;
	case KVPALACE__V1__REQUEST__OP_PREFETCH:
		if (req->prefetch->has_tier && !validate_read_tier(req->prefetch->tier))
			REJECT(-EINVAL, "prefetch into an unknown tier or the disk tier");
		if (req->prefetch->n_tokens > lim->max_tokens_per_request)
			REJECT(-EMSGSIZE, "too many tokens in one request");
		if (req->prefetch->has_cache_salt &&
		    req->prefetch->cache_salt.len > PREFIX_INDEX_MAX_SALT)
			REJECT(-EINVAL, "cache salt longer than 64 bytes");
		KEYS(validate_extra_key(req->prefetch->has_extra_key, req->prefetch->extra_key.len,
					ret_reason));
		KEYS(validate_key_spans(req->prefetch->key_spans, req->prefetch->n_key_spans,
					ret_reason));
		if (req->prefetch->n_key_spans &&
		    req->prefetch->key_spans[0]->first_token >= req->prefetch->n_tokens)
			REJECT(-EINVAL, "a prefetch's key spans start within its tokens");
		for (size_t i = 1; i < req->prefetch->n_key_spans; i++)
			if (req->prefetch->key_spans[i]->first_token >= req->prefetch->n_tokens)
				REJECT(-EINVAL, "a prefetch's key spans start within its tokens");
		break;
	case KVPALACE__V1__REQUEST__OP_TAG_SPAN:
		if (req->tag_span->has_summary && req->tag_span->summary &&
		    req->tag_span->has_permanent && !req->tag_span->permanent)
			REJECT(-EINVAL,
			       "a summary span is permanent: summary with permanent false");
		if (req->tag_span->has_summary && req->tag_span->summary && req->tag_span->n == 0)
			REJECT(-EINVAL, "an empty summary span");
		break;
	case KVPALACE__V1__REQUEST__OP_SET_POLICY:
	case KVPALACE__V1__REQUEST__OP_COMPACT:
	case KVPALACE__V1__REQUEST__OP_SESSION_META:
		break;
	case KVPALACE__V1__REQUEST__OP_REPORT_IMPORTANCE:
		if (req->report_importance->n_mass > lim->max_tokens_per_request)
			REJECT(-EMSGSIZE, "too many masses in one request");
		break;
	case KVPALACE__V1__REQUEST__OP_WARMUP:
		if (!ckpt_name_valid(req->warmup->name))
			REJECT(-EINVAL, "checkpoint names are 1..64 of A-Z a-z 0-9 . _ -, "
					"starting with a letter, digit or _");
		break;
	default:
		REJECT(-EPROTO, "request carries no known operation");
	}
	return 0;
}
