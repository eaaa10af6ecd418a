#!/bin/bash
mv notes.txt answer.txt
