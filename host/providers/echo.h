/* agenthost — the embedded default provider "echo": deterministic, offline, scriptable (internal).
 *
 * It answers a prompt with "echo: <text>" streamed as deltas, then committed. The prompt is read line by
 * line; a line that starts with a directive runs it (in order), the other lines form <text>:
 *   /sleep MS          wait MS milliseconds (cancellable) before going on
 *   /fail MESSAGE      end the turn with reason "error" and MESSAGE
 *   /tool NAME JSON    request tool NAME with arguments JSON; the result is committed as
 *                      "tool NAME: <result as compact JSON>" (or "tool NAME failed: <error>")
 *   /ask QUESTION      ask the user QUESTION; the answer is committed as "answer: <answer>"
 *   /subagent PROMPT   run a child session with PROMPT; its final text is committed as "subagent: <text>"
 *   /chunks N          stream the echo in N pieces (default 1), each of them in deltas of at most 64 KiB
 *   /max-tokens        end with reason "max-tokens" after the echo
 *   /refuse            end at once with reason "refusal" (nothing committed)
 *   /history           commit "history: N (role, role, …)": the conversation the agent hands the
 *                      provider for this turn (earlier turns only)
 * Usage: inputTokens = bytes of the prompt's text / 4 rounded up, outputTokens likewise for what it
 * committed — deterministic numbers for tests.
 *
 * Details (decisions the interface leaves open):
 * - The prompt is the content's text blocks concatenated, a resource_link rendered as "[name](uri)" (name
 *   defaults to uri); other block types are ignored. Content that is not an array of typed objects, a text
 *   block without a string text or a link without a uri makes turn_start() return AH_EINVAL. The usage's
 *   "bytes of the prompt's text" are those of this whole string, directive lines included.
 * - A directive is a known name right at the start of a line, followed by a space, a tab or the line's end;
 *   anything else ("/usr/bin", "/sleepy", " /sleep 5") is text. The text is the other lines joined with
 *   "\n" without leading and trailing blank lines. There is no echo when that text is empty and a
 *   directive committed something; otherwise (even for an empty prompt) "echo: <text>" is committed.
 * - The whole prompt is checked before anything runs: a malformed directive (/sleep not 0..3600000,
 *   /chunks not 1..1000, /tool without a name or with arguments that are not a JSON object, /ask or
 *   /subagent without text, an argument to /max-tokens or /refuse) ends the turn "error" with
 *   "line N: /directive ..." and nothing else happens. /refuse anywhere ends the turn "refusal" on its first
 *   tick, before any other directive runs. /tool without JSON sends {}; /fail without MESSAGE says "failed".
 *   /chunks and /max-tokens apply to the echo wherever they appear (the last /chunks wins).
 * - /chunks N streams N deltas cut at character boundaries (i*chars/N), never an empty one: when the echo
 *   has fewer than N characters, one delta per character. Directive results are committed without deltas.
 * - A tool error is committed with its message: a string result as it is, an object's "message" string,
 *   else the result as compact JSON. An answer that is a string is committed as it is, other JSON compact.
 *   A subagent that ended with a reason other than "end" is committed as "subagent (REASON): <text>".
 * - Tool calls get ids "call_1", "call_2", ... per turn; a result for another id is ignored.
 * - Every sink call happens in a callback of the turn's own handles, at most one per loop iteration;
 * turn_start(), the result functions and turn_cancel() never call the sink. turn_cancel() ends the turn
 * "cancelled" on the next tick whatever it waits for; a result that arrives afterwards is ignored, and so is
 * a cancel after end.
 * - turn_free() is valid from inside end() and also before end() (the turn then stops without calling the
 *   sink); the turn's memory is released in its handles' close callbacks.
 * - A prompt of 256 KiB or more is compiled (blocks joined, directives read, the echo built) on the loop's
 *   thread pool, so a large prompt is never copied or scanned on the loop; a cancel or free meanwhile takes
 *   effect when the compilation is back. A shorter one is compiled in turn_start() (the pool's round trip
 *   would cost more). No delta is longer than 64 KiB: a longer /chunks piece (or the whole echo,
 *   by default) streams in as many deltas as it takes, each cut before a character. The echo is committed
 *   through commit_json when the agent's sink has it (ABI 1.2), without a copy.
 * - Turns do not refer to the provider after turn_start(): ah__echo_provider_free() may run while turns
 *   live, but their loop must keep running until they were freed.
 */
#ifndef AGENTHOST_HOST_PROVIDERS_ECHO_H
#define AGENTHOST_HOST_PROVIDERS_ECHO_H

#include <uv.h>

#include "agenthost/provider.h"

/* A new echo provider whose timers run on `loop`. Free with ah__echo_provider_free(). */
ah_provider *ah__echo_provider_new(uv_loop_t *loop);
void ah__echo_provider_free(ah_provider *p);
/* Whether a turn with this content may ask for the history (a /history step). */
bool ah__echo_uses_history(const json_t *content);

#endif
