#!/bin/bash
mv input.txt out.txt
