// The chat page (/). Owns: the page state (current conversation, its messages, the running
// generation) and the commands it sends (generate, stop, regenerate, edit).
// Rendering lives in chat_messages.js, the sidebar in conversations.js, the settings panel
// in chat_settings.js; this module wires them together.
import { api, getJson } from "./api.js";
import { beamAnswerSteps, beamTokenDetails, setRecordedSteps } from "./chat_beams.js";
import { ChatSettings, OverrideError } from "./chat_settings.js";
import { isMissingSteps, newAssistantMessage, renderMessage, scheduleUpdate, stepAt, updateAssistant } from "./chat_messages.js";
import { ConversationList } from "./conversations.js";
import { $, h, wholeNamePicker, wirePanelToggles } from "./dom.js";
import { errorText } from "./format.js";
import { renderIcons } from "./icons.js";
import { promptView } from "./prompt_view.js";
import { ImageAttachments } from "./image_attach.js";
import { asDrawn } from "./sampling.js";
import { followRun } from "./run_state.js";
import { promptPerplexity } from "./surprise.js";
import { ModelStatus } from "./model_status.js";
import { GenerationSocket, showConnection } from "./socket.js";
import { TokenPopover, stepDetails } from "./token_popover.js";
import { gettext } from "./i18n.js";

const SUGGESTIONS = [
  "请给我讲一个故事",
  gettext("Explain what a KV cache is in two sentences."),
  gettext("Write a haiku about gradient descent."),
  gettext("List three uses of the Python `itertools` module."),
  gettext("What is the capital of France, and why is it famous?"),
];

const state = { conversation: null, messages: [], handle: null };

const input = $("#prompt-input");
const attachments = new ImageAttachments({ form: $("#composer"), input, tray: $("#image-tray"), button: $("#attach-btn"),
  onError: (message) => showError({ message }) });
const messagesEl = $("#messages");
const messagesInner = $("#messages-inner");
// The chosen model's note, and "loading…" on an answer that waits for its worker to load the model.
const modelStatus = new ModelStatus($("#model-select"), { onTick: showModelLoading });
wholeNamePicker($("#model-select"));
const socket = new GenerationSocket({ onStatus: showConnection($("#conn")), onWorkerModel: (e) => modelStatus.onWorkerModel(e) });
const settings = new ChatSettings(saveConversationSetting, modelStatus, (model) => attachments.setModel(model));
const conversations = new ConversationList($("#conv-list"), {
  onSelect: (id) => openConversation(id),
  onRenamed: (conv) => { if (state.conversation?.id === conv.id) setTitle(conv.title); },
  onDeleted: (id) => { if (state.conversation?.id === id) newChat(); },
  onError: showError,
});
new TokenPopover(messagesEl, (tok) => {
  const message = state.messages.find((m) => m.el?.contains(tok));
  // greedy's "sampled" column is all on the token it took (sampling.js asDrawn)
  return message ? asDrawn(stepAt(message.steps, Number(tok.dataset.step)), message.params) : null;
}, (step) => (step.isBeam ? beamTokenDetails(step) : stepDetails(step)),
// an answer's Regenerate, Copy, … stay clickable: the card keeps off them
(tok) => tok.closest(".msg")?.querySelectorAll(".msg-foot .msg-actions") ?? []);

const actions = {
  canEdit: (message) => !isBusy() && message.id !== null,
  edit: editAndResend,
  regenerate,
  showPrompt,
  ensureSteps,
  promptPerplexity: showPromptPerplexity,
};

// ---------- sending ----------

function send(content) {
  if (!content || isBusy()) return;
  const fields = readCommandFields();
  if (!fields) return;
  const images = attachments.take();
  const user = { role: "user", id: null, content, images };
  const answer = newAssistantMessage({ isStreaming: true, modelName: settings.modelName(settings.modelId) });
  appendMessages(user, answer);
  input.value = "";
  autosize();
  const command = { command: "generate", content, ...fields };
  if (images.length) command.images = images;
  if (state.conversation) command.conversation_id = state.conversation.id;
  else if (settings.systemPrompt.value.trim()) command.system_prompt = settings.systemPrompt.value;
  startGeneration(command, answer, {
    onQueued: (event) => {
      user.id = event.user_message_id;
      if (!state.conversation) {
        state.conversation = { id: event.conversation_id, title: content.slice(0, 60) };
        setTitle(state.conversation.title);
        history.replaceState(null, "", `#c${event.conversation_id}`);
      }
      conversations.activeId = event.conversation_id;
      conversations.refresh();
    },
    onRefused: () => {
      removeMessages(user, answer);
      input.value = content;
      attachments.restore(images);
      autosize();
    },
  });
}

function regenerate(answer) {
  if (isBusy() || answer.id === null) return;
  const fields = readCommandFields();
  if (!fields) return;
  const previous = { ...answer };
  Object.assign(answer, newAssistantMessage({ isStreaming: true, modelName: answer.modelName }));
  updateAssistant(answer);
  startGeneration({ command: "regenerate", message_id: previous.id, ...fields }, answer, {
    onRefused: () => {
      Object.assign(answer, previous);
      updateAssistant(answer);
    },
  });
}

function editAndResend(user, content) {
  if (isBusy()) return;
  const fields = readCommandFields();
  if (!fields) return;
  const index = state.messages.indexOf(user);
  const removed = state.messages.slice(index + 1);
  const previousContent = user.content;
  removeMessages(...removed);
  user.content = content;
  user.el.replaceWith(renderMessage(user, actions));
  const answer = newAssistantMessage({ isStreaming: true, modelName: settings.modelName(settings.modelId) });
  appendMessages(answer);
  startGeneration({ command: "edit", message_id: user.id, content, ...fields }, answer, {
    onRefused: () => {
      removeMessages(answer);
      user.content = previousContent;
      user.el.replaceWith(renderMessage(user, actions));
      appendMessages(...removed);
    },
  });
}

/** Send `command` and stream its events into `answer`. */
function startGeneration(command, answer, { onQueued = () => {}, onRefused }) {
  hideError();
  state.handle = socket.start(command, answerHandlers(answer, { onQueued, onRefused }));
  setBusy(true);
}

/** A reloaded page follows the generation it left running: the saved part, then live steps. */
function resumeGeneration(answer) {
  Object.assign(answer, { isStreaming: true, steps: [], beamSteps: [], text: "" });
  state.handle = socket.attach(answer.generation_id, answerHandlers(answer, { onRefused: () => {} }));
  setBusy(true);
}

/** The socket handlers that fold one streaming answer's events into it (the answer is a run,
 * run_state.js, with the message's own fields), then redraw it: a new generation or a re-attached one. */
function answerHandlers(answer, { onQueued = () => {}, onRefused }) {
  return followRun(answer, (run, type, event) => {
    switch (type) {
      case "generation.queued":
        answer.id = answer.message_id;
        onQueued(event);
        return;
      case "generation.started":
        answer.modelName = answer.model?.name ?? answer.model ?? answer.modelName;
        break;
      case "generation.tokens": {
        const isAtBottom = nearBottom();  // the page is redrawn at the next frame
        scheduleUpdate(answer);
        if (isAtBottom) requestAnimationFrame(scrollToBottom);
        return;
      }
      case "generation.finished":
        answer.isStreaming = false;
        answer.content = answer.text;
        if (answer.beamSteps.length) answer.steps = beamAnswerSteps(answer.stats?.sequences?.[0], answer.beamSteps);
        answer.id = answer.message_id ?? answer.id;
        updateAssistant(answer);
        setBusy(false);
        conversations.refresh();
        // The saved record has every step: the strip and the token cards then count them all.
        if (isMissingSteps(answer)) loadSteps(answer);
        return;
      case "error":
      case "generation.error":
        setBusy(false);
        if (answer.error.isRefused) {
          onRefused();
          showError(event);
          return;
        }
        answer.isStreaming = false;
        answer.content = answer.text || answer.content;
        updateAssistant(answer);
        return;
      default:
        break;
    }
    scheduleUpdate(answer);
  });
}

/** The model, preset and overrides for a command; null (and the bad field shown) if invalid. */
function readCommandFields() {
  try {
    return settings.commandFields();
  } catch (err) {
    if (!(err instanceof OverrideError)) throw err;
    document.body.classList.add("show-settings");
    showError(err);
    return null;
  }
}

// ---------- conversations ----------

async function openConversation(id) {
  document.body.classList.remove("show-sidebar");
  let conversation;
  try {
    conversation = await getJson(`/api/conversations/${id}/`);
  } catch (err) {
    showError(err);
    return;
  }
  state.conversation = conversation;
  settings.showConversation(conversation);
  const modelName = settings.modelName(conversation.model_id);
  const messages = conversation.messages.filter((m) => m.role !== "system")
    .map((m) => (m.role === "assistant" ? newAssistantMessage({ ...m, modelName }) : { ...m }));
  setMessages(messages);
  const running = messages.findLast((m) => m.role === "assistant" && ["queued", "running"].includes(m.status));
  if (running && running.generation_id && !isBusy()) resumeGeneration(running);
  setTitle(conversation.title);
  conversations.setActive(id);
  history.replaceState(null, "", `#c${id}`);
  scrollToBottom();
}

function newChat() {
  state.conversation = null;
  settings.showConversation(null);
  setMessages([]);
  setTitle(gettext("New chat"));
  conversations.setActive(null);
  history.replaceState(null, "", location.pathname);
  input.focus();
}

async function saveConversationSetting(patch) {
  if (!state.conversation) return;
  try {
    await api("PATCH", `/api/conversations/${state.conversation.id}/`, patch);
  } catch (err) {
    showError(err);
  }
}

// ---------- message details ----------

/** Historic messages load their steps (and prompt) on first hover. */
async function ensureSteps(answer) {
  if (answer.steps.length || answer.prompt || !answer.generation_id || answer.isStreaming) return;
  await loadSteps(answer);
}

/** The generation's saved record: its steps, prompt and sampling params. */
async function loadSteps(answer) {
  if (answer.isLoading) return;
  answer.isLoading = true;
  try {
    const generation = await getJson(`/api/generations/${answer.generation_id}/`);
    answer.prompt = answer.prompt ?? generation.prompt;
    answer.params = answer.params ?? generation.params;
    answer.stats = answer.stats ?? generation.stats;
    setRecordedSteps(answer, generation.steps || [], answer.stats);
    updateAssistant(answer);
  } catch (err) {
    console.warn("could not load the generation's steps", err);
  } finally {
    answer.isLoading = false;
  }
}

async function showPromptPerplexity(answer) {
  answer.promptPerplexity = { isLoading: true };
  updateAssistant(answer);
  try {
    answer.promptPerplexity = await promptPerplexity(answer.generation_id);
  } catch (err) {
    answer.promptPerplexity = { error: err };
  }
  updateAssistant(answer);
}

async function showPrompt(answer) {
  await ensureSteps(answer);
  const body = $("#prompt-dialog-body");
  if (!answer.prompt) {
    body.replaceChildren(h("p", { class: "empty" }, gettext("The prompt is not available for this message.")));
  } else {
    const numCached = answer.prefilled?.num_cached_tokens ?? answer.stats?.num_cached_tokens ?? 0;
    body.replaceChildren(promptView(answer.prompt, numCached));
  }
  $("#prompt-dialog").showModal();
}

// ---------- page plumbing ----------

function setMessages(messages) {
  state.messages = [];
  messagesInner.replaceChildren();
  appendMessages(...messages);
}

function appendMessages(...messages) {
  messagesInner.querySelector(".empty-state")?.remove();
  for (const message of messages) {
    state.messages.push(message);
    messagesInner.append(message.el ?? renderMessage(message, actions));
  }
  if (!state.messages.length) messagesInner.replaceChildren(emptyState());
  scrollToBottom();
}

function removeMessages(...messages) {
  for (const message of messages) message.el?.remove();
  state.messages = state.messages.filter((m) => !messages.includes(m));
  if (!state.messages.length) messagesInner.replaceChildren(emptyState());
}

function emptyState() {
  return h("div", { class: "empty-state" },
    h("div", { class: "brand-mark" }, "✦"),
    h("h2", {}, gettext("What would you like to ask?")),
    h("p", {}, gettext("Answers stream token by token. Hover any token to see the alternatives the model considered.")),
    h("div", { class: "suggestions" }, SUGGESTIONS.map((text) =>
      h("button", { class: "suggestion", type: "button", onclick: () => send(text) }, text))));
}

function setTitle(title) {
  $("#chat-title").textContent = title || gettext("New chat");
}

/** While the chosen model loads on a worker, the answer waiting for it says so, with the time so far. */
function showModelLoading() {
  const answer = state.messages.findLast((m) => m.role === "assistant" && m.isStreaming && !m.prefilled);
  if (!answer) return;
  answer.modelLoading = modelStatus.loading(settings.modelId);
  scheduleUpdate(answer);
}

function isBusy() {
  return state.handle !== null && !state.handle.isDone;
}

function setBusy(isBusyNow) {
  $("#send-btn").hidden = isBusyNow;
  $("#stop-btn").hidden = !isBusyNow;
}

function showError(error) {
  const el = $("#composer-error");
  el.textContent = errorText(error);
  el.hidden = false;
  $("#composer-hint").hidden = true;
}

function hideError() {
  $("#composer-error").hidden = true;
  $("#composer-hint").hidden = false;
}

function nearBottom() {
  return messagesEl.scrollHeight - messagesEl.scrollTop - messagesEl.clientHeight < 80;
}

function scrollToBottom() {
  messagesEl.scrollTop = messagesEl.scrollHeight;
}

function autosize() {
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 200)}px`;
}

function wireComposer() {
  $("#composer").addEventListener("submit", (e) => { e.preventDefault(); send(input.value.trim()); });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(input.value.trim()); }
  });
  input.addEventListener("input", () => { autosize(); hideError(); });
  $("#stop-btn").addEventListener("click", () => state.handle?.stop());
  $("#new-chat").addEventListener("click", newChat);
  $("#colorize").addEventListener("change", (e) => messagesEl.classList.toggle("colorize", e.target.checked));
  $("#prompt-dialog-close").addEventListener("click", () => $("#prompt-dialog").close());
}

async function init() {
  renderIcons();
  wirePanelToggles();
  wireComposer();
  setMessages([]);
  conversations.refresh();
  try {
    await settings.load();
  } catch (err) {
    showError(err);
  }
  const match = location.hash.match(/^#c(\d+)$/);
  if (match) openConversation(Number(match[1]));
  else input.focus();
}

init();
