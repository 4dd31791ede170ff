// The lesson page (/learn/): one section per chapter of the lesson, each an experiment on the
// running model (learn_*.js). Owns: the page's socket and request runner, and the line that
// names the model the experiments run on. Must not know what a section measures.
import { getJson } from "./api.js";
import { $ } from "./dom.js";
import { gettext, interpolate } from "./i18n.js";
import { setupConstrained } from "./learn_constrained.js";
import { setupDeepseek } from "./learn_deepseek.js";
import { setupKv } from "./learn_kv.js";
import { setupPhases } from "./learn_phases.js";
import { setupPipeline } from "./learn_pipeline.js";
import { setupRoles } from "./learn_roles.js";
import { LessonRunner } from "./learn_run.js";
import { setupSampling } from "./learn_sampling.js";
import { setupSpeculative } from "./learn_speculative.js";
import { GenerationSocket, showConnection } from "./socket.js";

const socket = new GenerationSocket({ onStatus: showConnection($("#conn")) });
const runner = new LessonRunner(socket);

setupPipeline(runner);
setupKv(runner);
setupPhases(runner);
setupSpeculative(runner);
setupRoles(runner);
setupSampling(runner);
setupConstrained(runner);
setupDeepseek(runner);

async function showModel() {
  try {
    const models = await getJson("/api/models/");
    const model = models.find((m) => m.is_default) ?? models[0];
    $("#learn-model").textContent = model
      ? interpolate(gettext("The experiments run on this server's default model, %(name)s. The first request also loads it, so it takes longer."), { name: model.name })
      : gettext("No model is registered on this server: add one in the admin.");
  } catch (err) {
    $("#learn-model").textContent = err.message;
  }
}

showModel();
